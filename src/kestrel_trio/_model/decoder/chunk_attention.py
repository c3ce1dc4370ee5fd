"""Attention of one sequence's prefill chunk from its fused q/k/v product, the queries, keys and values in one pass.

Shared by the layer loop over rows (kestrel_trio._model.decoder.forward) and over packed rows
(kestrel_trio._model.decoder.packed_layers): both hand over the chunk's q/k/v product [T, (n_heads + 2 n_kv) * head_dim]
and take back the attention output before o_proj.
"""

from __future__ import annotations

import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._model.checkpoints.config import ModelConfig
from kestrel_trio._model.cache.kv_cache import KVCache
from kestrel_trio._model.decoder.layers import causal_attention
from kestrel_trio._model.products.matmul import run_shared, shares_of
from kestrel_trio._model.weights.assemble import Attention

__all__ = ["chunk_attention", "SHARED_QKV_ELEMENTS"]

# From this many elements of q/k/v product a chunk's pass over them is shared among the product threads (a
# 256-token chunk of Qwen3-0.6B has 1 Mi: 0.62 ms on one thread).
SHARED_QKV_ELEMENTS = 1 << 18


def chunk_attention(c: ModelConfig, a: Attention, index: int, qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray,
                    cache: KVCache, tail: int) -> np.ndarray | None:
    """The attention output [tail, n_heads * head_dim] of the chunk's last ``tail`` queries, before o_proj.

    The chunk's queries normed and rotated, its keys and values written into ``cache`` at layer ``index``, in one
    pass (kestrel_trio._kernels.qkv_rows); every query then sees the keys before it. None, with nothing written,
    where that pass cannot run: a bf16 or float16 cache, no compiled loops, or arrays of other kinds.

    Args:
        qkv: float32 [T, (n_heads + 2 n_kv) * head_dim], the chunk's fused q/k/v product (biases added).
        cos, sin: float32 [T, head_dim / 2] each, the chunk's rotations.
        cache: the sequence's cache, reserved for the chunk, its length the tokens before it.
        tail: the last queries whose output is wanted (0: keys and values only).
    """
    buffers = cache.float32_buffers(index)
    if buffers is None:
        return None
    sharing = (run_shared, shares_of) if qkv.size >= SHARED_QKV_ELEMENTS else (None, None)
    q = _kernels.qkv_rows(qkv, c.num_attention_heads, c.num_key_value_heads, c.head_dim, a.q_norm, a.k_norm,
                          c.rms_norm_eps, cos, sin, *buffers, cache.length, *sharing)  # [T, n_heads, head_dim]
    if q is None:
        return None
    length = qkv.shape[0]
    if not tail:  # a chunk before the last, at the last layer: its keys and values only
        return np.empty((0, q.shape[1] * q.shape[2]), dtype=np.float32)  # [0, n_heads*head_dim]
    keys, values = cache.stored(index, length)  # [n_kv, past+T, head_dim] each
    return causal_attention(q[length - tail :], keys, values, cache.length + length - tail,
                            c.head_dim**-0.5)  # [tail, n_heads*head_dim]
