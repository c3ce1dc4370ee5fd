"""A prefill chunk's queries, keys and values from the fused q/k/v product in one pass (numba).

After the q/k/v product a layer's forward made five passes: RMS norms of
the query heads and of the key heads (Qwen3), rotary embedding of each,
and the copy of the keys and values into the KV cache ([T, n_kv, head_dim]
to [n_kv, T, head_dim]). Here each token's row of the product is read once:
its query heads normed and rotated into ``q``, its key heads normed and
rotated and its value heads copied into the cache's float32 buffers at the
token's position. The arithmetic is kestrel_trio._kernels.portable.norm's and
kestrel_trio._kernels.portable.rope's (the same flags: reassociated sums of squares,
no fused multiply-adds), so a token's values agree with the five passes'
to an ulp or so.

Measured on the 2-core Xeon with AMX (Qwen3-0.6B's shapes, a
512-token prefill in chunks of 256): the five passes took 77-86 ms of it;
this pass, shared between the product threads by tokens, and the two norms
left took 53-58 (three runs each). On one thread it is no faster than the
passes it replaces (624 us a 256-token chunk; the query heads alone 218 us
against 261 for their norm and rotation): the gain is that it shares.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["qkv_rows"]


@njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "nsz"})
def qkv_rows(qkv, n_heads, n_kv, q_norm, k_norm, normed, eps, cos, sin, q, keys, values, past, first, stop):
    """Tokens [first, stop) of ``qkv`` into ``q`` and the cache buffers.

    Args:
        qkv: float32 [T, (n_heads + 2 n_kv) * head_dim], C-contiguous: the query heads, the key heads, the values.
        n_heads, n_kv: query and key/value heads.
        q_norm, k_norm: float32 [head_dim], the heads' RMS norm weights (read only when ``normed``).
        normed: whether the heads are normed before rotation (Qwen3), else only rotated.
        eps: float32, the norm's epsilon.
        cos, sin: float32 [T, head_dim/2], each token's rotation.
        q: float32 [T, n_heads, head_dim], written.
        keys, values: float32 [n_kv, capacity, head_dim], the cache's buffers: token a at ``past + a``.
        past: tokens in the cache before the chunk.
        first, stop: the tokens to do.
    """
    head_dim = q.shape[2]
    for a in range(first, stop):
        for h in range(n_heads):
            _rotated_row(qkv, a, h * head_dim, q_norm, normed, eps, cos, sin, q[a, h])
        for h in range(n_kv):
            _rotated_row(qkv, a, (n_heads + h) * head_dim, k_norm, normed, eps, cos, sin, keys[h, past + a])
            start = (n_heads + n_kv + h) * head_dim
            for i in range(head_dim):
                values[h, past + a, i] = qkv[a, start + i]


@njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "nsz"})
def _rotated_row(qkv, a, start, weight, normed, eps, cos, sin, out):
    """``qkv[a, start : start + dim]``, normed when ``normed``, rotated by token ``a``'s angles into ``out`` [dim]."""
    dim = out.shape[0]
    half = dim // 2
    scale = np.float32(1.0)
    if normed:
        total = np.float32(0.0)
        for i in range(dim):
            total += qkv[a, start + i] * qkv[a, start + i]
        scale = np.float32(1.0) / np.sqrt(total / np.float32(dim) + eps)
    for i in range(half):
        x1 = qkv[a, start + i]
        x2 = qkv[a, start + half + i]
        if normed:  # the norm's products rounded as rms_norm rounds them, then rope's
            x1 = x1 * scale * weight[i]
            x2 = x2 * scale * weight[half + i]
        c = cos[a, i]
        s = sin[a, i]
        out[i] = x1 * c - x2 * s
        out[half + i] = x2 * c + x1 * s
