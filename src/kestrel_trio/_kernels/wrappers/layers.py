"""The layers' compiled loops behind checks: each wrapper takes arrays as a forward pass holds them and returns
None where the loops cannot run or the arrays are not of their kind (the caller keeps its numpy path).

Portable: the loops (chunk_qkv, rope, norm, exp) compile for any CPU numba
supports. Re-exported by kestrel_trio._kernels, where kestrel_trio._model calls
them. Whether a decode step's attention is shared among the product threads
is the caller's choice (kestrel_trio._model.decoder.layers.SHARED_DECODE_SCORES):
a wrapper shares where it is handed the threads.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from kestrel_trio._kernels import loaded
from kestrel_trio._kernels.portable.spans import run_spans

__all__ = ["qkv_rows", "rotate_half", "rms_norm", "norm_span", "softmax_numerators", "swiglu", "decode_attention",
           "decode_buffers", "decode_attentions"]


# ---------------------------------------------------------------- a chunk's queries, keys and values


def qkv_rows(qkv: np.ndarray, n_heads: int, n_kv: int, head_dim: int, q_norm: np.ndarray | None,
             k_norm: np.ndarray | None, eps: float, cos: np.ndarray, sin: np.ndarray, keys: np.ndarray,
             values: np.ndarray, past: int, run: Callable[[list[Callable[[], None]]], None] | None,
             shares: Callable[[int], list[tuple[int, int]]] | None) -> np.ndarray | None:
    """The queries [T, n_heads, head_dim] of a fused q/k/v product, normed and rotated; its keys and values into
    the cache, in one pass (kestrel_trio._kernels.qkv_rows), or None (nothing written).

    Args:
        qkv: float32 [T, (n_heads + 2 n_kv) * head_dim], C-contiguous.
        n_heads, n_kv, head_dim: the attention's shape.
        q_norm, k_norm: float32 [head_dim] each (Qwen3's per-head RMS norms), or both None (rotation only).
        eps: the norms' epsilon.
        cos, sin: float32 [T, head_dim/2], the tokens' rotations.
        keys, values: float32 [n_kv, capacity, head_dim], a KV cache's buffers; token a goes to ``past + a``.
        past: the cache's tokens before these.
        run, shares: as :func:`chunk_product`'s, the tokens shared among the threads; None: on this thread.

    Returns:
        The queries, or None where the compiled loops cannot run or an array is not of that kind.
    """

    t = qkv.shape[0]
    norms = (q_norm, k_norm)
    floats = (qkv, cos, sin, keys, values) + (norms if q_norm is not None else ())
    if not (loaded.ready() and all(a.dtype == np.float32 for a in floats) and qkv.flags.c_contiguous
            and head_dim % 2 == 0
            and qkv.shape == (t, (n_heads + 2 * n_kv) * head_dim) and cos.shape == sin.shape == (t, head_dim // 2)
            and keys.shape == values.shape and keys.shape[0] == n_kv and keys.shape[1] >= past + t
            and keys.shape[2] == head_dim and (q_norm is None) == (k_norm is None)
            and all(n.shape == (head_dim,) for n in norms if n is not None)):
        return None
    from kestrel_trio._kernels.portable import chunk_qkv  # numba is imported: this only compiles or loads the loop

    q = np.empty((t, n_heads, head_dim), dtype=np.float32)  # [T, n_heads, head_dim]
    normed = q_norm is not None
    q_weight, k_weight = (q_norm, k_norm) if normed else (cos[0], cos[0])  # unread without norms

    def rows(first: int, stop: int) -> None:
        chunk_qkv.qkv_rows(qkv, n_heads, n_kv, q_weight, k_weight, normed, np.float32(eps), cos, sin, q, keys, values,
                           past, first, stop)

    run_spans(rows, t, run, shares)
    return q


# ---------------------------------------------------------------- rotary embedding


def rotate_half(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray | None:
    """``x`` float32 [T, heads, dim] rotated by ``cos``, ``sin`` float32 [T, dim/2], in one compiled pass.

    None where the compiled loops cannot run (:func:`kestrel_trio._kernels.ready`): the caller keeps its numpy path.
    """

    if not loaded.ready():
        return None
    from kestrel_trio._kernels.portable import rope  # numba is imported: this only compiles or loads the loop

    out = np.empty(x.shape, dtype=np.float32)  # [T, heads, dim]
    rope.rotate_half(x, cos, sin, out)
    return out


# ---------------------------------------------------------------- RMS norm


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray | None:
    """``x`` float32 [T, dim] or [T, heads, dim] normed over dim and scaled by ``weight`` [dim], in one compiled call.

    None where the compiled loops cannot run or the arrays are not of that kind: the caller keeps its numpy path.
    """

    if not (loaded.ready() and x.dtype == np.float32 and weight.dtype == np.float32 and x.ndim in (2, 3)):
        return None
    from kestrel_trio._kernels.portable import norm

    rows = x if x.ndim == 3 else x[:, None, :]  # [T, heads, dim]
    flat = _unit_stride_span(rows)  # [span]
    if flat is None or not weight.flags.c_contiguous:
        return None
    out = np.empty(rows.shape, dtype=np.float32)  # [T, heads, dim]
    norm.rms_norm(flat, rows.strides[0] // 4, rows.strides[1] // 4, weight, np.float32(eps), out)
    return out.reshape(x.shape)


def _unit_stride_span(rows: np.ndarray) -> np.ndarray | None:
    """The 1-D float32 span of ``rows`` [T, heads, dim] from its first element to its last, or None.

    None unless dim is unit-stride and the other strides are whole, non-negative elements: then
    ``rows[a, h, i]`` is ``span[a * strides[0] + h * strides[1] + i]`` (strides in elements).
    """
    t, heads, dim = rows.shape
    strides = rows.strides
    if rows.size == 0 or (dim > 1 and strides[2] != 4) or any(s < 0 or s % 4 for s in strides[:2]):
        return None
    span = (t - 1) * (strides[0] // 4) + (heads - 1) * (strides[1] // 4) + dim  # elements
    return np.lib.stride_tricks.as_strided(rows, shape=(span,), strides=(4,))  # [span], a view


# ---------------------------------------------------------------- exponentials (softmax, SiLU)


def softmax_numerators(scores: np.ndarray) -> np.ndarray | None:
    """``scores`` float32 [..., S], C-contiguous, to e^(s - its row's max) in place; the row sums [..., 1].

    None (``scores`` untouched) where the compiled loops cannot run or the array is not of that kind.
    """

    if not (loaded.ready() and scores.dtype == np.float32 and scores.flags.c_contiguous and scores.size):
        return None
    from kestrel_trio._kernels.portable import exp  # numba is imported: this only compiles or loads the loops

    rows = scores.reshape(-1, scores.shape[-1])  # [R, S], a view
    sums = np.empty(scores.shape[:-1] + (1,), dtype=np.float32)  # [..., 1]
    # The maxima in numpy, whose max vectorizes (exp.softmax_shifted says why): a row with a NaN gets NaN, and
    # the whole row's output is NaN, as its NaN sum made it before.
    exp.softmax_shifted(rows, rows.max(axis=1), sums.reshape(-1))
    return sums


def swiglu(gate_up: np.ndarray) -> np.ndarray | None:
    """silu(gate) * up, float32 [N, D], for ``gate_up`` float32 [N, 2D] (C-contiguous) holding gate, then up.

    None where the compiled loops cannot run or the array is not of that kind.
    """

    if not (loaded.ready() and gate_up.dtype == np.float32 and gate_up.flags.c_contiguous and gate_up.ndim == 2):
        return None
    from kestrel_trio._kernels.portable import exp

    out = np.empty((gate_up.shape[0], gate_up.shape[1] // 2), dtype=np.float32)  # [N, D]
    exp.swiglu(gate_up, out)
    return out


def _whole_buffer(view: np.ndarray) -> np.ndarray | None:
    """The C-contiguous float32 [h, capacity, d] buffer whose prefix along axis 1 ``view`` is, or None."""
    base = view.base if view.base is not None else view
    if (isinstance(base, np.ndarray) and base.dtype == np.float32 and base.ndim == 3 and base.flags.c_contiguous
            and base.ctypes.data == view.ctypes.data and base.strides == view.strides
            and base.shape[0] == view.shape[0] and base.shape[2] == view.shape[2]):
        return base
    return None


def decode_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float,
                     run_shared: Callable | None = None, shares_of: Callable | None = None) -> np.ndarray | None:
    """One query's grouped attention, [n_heads * hd]: ``q`` float32 [n_heads, hd] over ``keys``, ``values``.

    ``keys``, ``values``: float32 [n_kv, total, hd], each a prefix of a C-contiguous buffer (a KV cache's).
    Scores are ``(q * scale) . k``. With ``run_shared`` and ``shares_of`` (kestrel_trio._model.products.matmul's), a
    context's kv heads are shared among the product threads (the caller passes them from its threshold of query-head
    x key scores). None where the compiled loops cannot run or the arrays are not of that kind.
    """
    cached = _cache_buffers(keys, values) if loaded.ready() and q.dtype == np.float32 and q.ndim == 2 else None
    if cached is None:
        return None
    from kestrel_trio._kernels.portable import exp

    key_buffer, value_buffer, total = cached
    n_kv = keys.shape[0]
    out = np.empty(q.shape, dtype=np.float32)  # [n_heads, hd]
    scale = np.float32(scale)
    if run_shared is None or shares_of is None:
        exp.decode_attention(q, key_buffer, value_buffer, total, 0, n_kv, scale, out)
    else:
        run_shared([lambda a=a, b=b: exp.decode_attention(q, key_buffer, value_buffer, total, a, b, scale, out)
                    for a, b in shares_of(n_kv)])
    return out.reshape(-1)


def decode_buffers(q: np.ndarray, stored: Sequence[tuple[np.ndarray, np.ndarray]],
                   out: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, int]] | None:
    """Per sequence of a batched decode step, its whole float32 key and value buffers and its key count.

    ``q`` [B, n_heads, hd] and ``out`` [B, n_heads, hd] must be C-contiguous float32, and each of ``stored``
    (keys, values [n_kv, total, hd]) a prefix of a KV cache's buffers; None otherwise, or where the compiled
    loops cannot run: the caller keeps its per-sequence path.
    """

    if not (loaded.ready() and q.dtype == np.float32 and q.ndim == 3 and q.flags.c_contiguous
            and out.flags.c_contiguous
            and out.dtype == np.float32 and out.shape == q.shape and len(stored) == q.shape[0]):
        return None
    buffers = [_cache_buffers(keys, values) for keys, values in stored]
    return None if any(cached is None for cached in buffers) else buffers


def _cache_buffers(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """The whole float32 buffers that one sequence's ``keys``, ``values`` [n_kv, total, hd] are prefixes of, and
    total; None if there are no keys or either is not such a prefix."""
    key_buffer, value_buffer = _whole_buffer(keys), _whole_buffer(values)
    if key_buffer is None or value_buffer is None or keys.shape[1] == 0:
        return None
    return key_buffer, value_buffer, keys.shape[1]


def decode_attentions(q: np.ndarray, buffers: Sequence[tuple[np.ndarray, np.ndarray, int]], scale: float,
                      out: np.ndarray, first: int, stop: int) -> None:
    """``out[i]`` [n_heads, hd] = ``q[i]``'s attention over ``buffers[i]`` (:func:`decode_buffers`), i in [first, stop).

    One compiled call a sequence and nothing else: the per-sequence checks of :func:`decode_attention`, its
    output array and the copy into the step's rows cost a short context more than the attention (Qwen3-0.6B's
    shapes, 8 sequences of 60 keys, 2-core Zen 5: 204 against 371 us a layer).
    """
    from kestrel_trio._kernels.portable import exp

    scale = np.float32(scale)
    for i in range(first, stop):
        key_buffer, value_buffer, total = buffers[i]
        exp.decode_attention(q[i], key_buffer, value_buffer, total, 0, key_buffer.shape[0], scale, out[i])


def norm_span(x: np.ndarray) -> tuple[np.ndarray, int, int] | None:
    """(the span, row stride, head stride) :func:`rms_norm` hands its compiled loop for ``x`` float32 [T, dim] or
    [T, heads, dim], or None where it would not take it: so that a caller holding fixed buffers calls the loop
    itself with the same arguments (kestrel_trio._model.decoder.decode_step)."""
    rows = x if x.ndim == 3 else x[:, None, :]  # [T, heads, dim]
    flat = _unit_stride_span(rows)  # [span]
    return None if flat is None else (flat, rows.strides[0] // 4, rows.strides[1] // 4)
