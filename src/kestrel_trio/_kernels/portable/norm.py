"""Root-mean-square norm in one compiled pass (numba), a decode step's few rows or a prefill chunk's many.

A decode step norms a handful of rows 113 times (Qwen3-0.6B: two norms a
layer over the hidden state, two over the query and key heads, one before
lm_head). numpy's version is five calls (a sum of squares, a division, a
square root, two products), each a few microseconds of dispatch; between
two weight products, whose streaming has evicted numpy's code and data
from the caches, they took 18.5 us a norm (2.1 ms of a 62-75 ms batch-1
step, measured on the 2-core Zen 5). Here it is one call. A prefill chunk's
rows are one pass instead of five as well: 256 rows of Qwen3-0.6B's shapes
took 33 us (hidden) and 77 us (query heads) against numpy's 114 and 316.

The sum of squares is reassociated (a vector sum, as numpy's einsum also
sums in its own order): rows agree with numpy's to a few ulp (at most 5 in
tests/model/test_norm_kernel.py's rows; the limit there is 8). The scale
and the two products round as numpy's do (no fused multiply-add, no
reciprocal approximations).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["rms_norm", "rms_norm_packed"]


@njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "nsz"})
def rms_norm(flat, row_stride, head_stride, weight, eps, out):
    """``out`` [T, heads, dim] = x * rsqrt(mean(x^2) + ``eps``) * ``weight`` [dim], per row of dim.

    x[a, h, i] is ``flat[a * row_stride + h * head_stride + i]``: ``flat`` is a 1-D contiguous span of the
    caller's buffer, so the loops over ``i`` are unit-stride and vectorize (a strided 3-D view, the query and
    key heads of the fused q/k/v product, compiled element by element: 134 ns a 128-dim row).
    """
    t, heads, dim = out.shape
    for a in range(t):
        for h in range(heads):
            start = a * row_stride + h * head_stride
            row = flat[start : start + dim]  # a slice: indexed by range(dim), no negative-index wraparound per element
            total = np.float32(0.0)
            for i in range(dim):
                total += row[i] * row[i]
            scale = np.float32(1.0) / np.sqrt(total / np.float32(dim) + eps)
            for i in range(dim):
                out[a, h, i] = row[i] * scale * weight[i]


@njit(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "nsz"})
def rms_norm_packed(x, weight, eps, out):
    """:func:`rms_norm` of rows held packed: ``out`` [B, dim, L] from ``x`` [B, dim, L] (token ``L b + lane`` at
    ``x[b, :, lane]``, _kernels.x86.float32.chunks' layout). The loops over a block's lanes vectorize, a token
    a lane; its sum of squares adds up in another order than rms_norm's rows do (they agree to a few ulp)."""
    blocks, dim, lanes = x.shape
    scales = np.empty(lanes, np.float32)  # [L]
    for b in range(blocks):
        scales[:] = 0
        for i in range(dim):
            for lane in range(lanes):
                scales[lane] += x[b, i, lane] * x[b, i, lane]
        for lane in range(lanes):
            scales[lane] = np.float32(1.0) / np.sqrt(scales[lane] / np.float32(dim) + eps)
        for i in range(dim):
            for lane in range(lanes):
                out[b, i, lane] = x[b, i, lane] * scales[lane] * weight[i]
