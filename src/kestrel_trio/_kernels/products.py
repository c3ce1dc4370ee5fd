"""Products with packed weights, each weight row expanded once into a small buffer and used while hot.

Theory of operation: a decode step with packed weights (bf16, int8, int4, a
GGUF's blocks) used to expand cache-sized chunks with numpy and multiply them
with BLAS. numpy has no mixed-precision kernel: its int8-to-float32 cast
alone cost about as much as the whole float32 product it was meant to beat
(0.18-0.21 ns a weight against 0.20). Here each row of weights is expanded
by its form's exact expander (kestrel_trio._kernels.rows) into a buffer of
one row (a few KiB, in L1) and multiplied at once with every activation row,
four at a time, so the weights are read from memory once, in their compact
form, and expanded once per step whatever the batch.

The dot products are compiled with fastmath (reassociation lets LLVM keep
vector accumulators), so they round differently from BLAS in the last bits;
the expanded weights themselves are exact (:func:`expand`).

The functions release the GIL (``nogil``): the product threads of
kestrel_trio._model.matmul run them on separate cores, each on its own
stretch of rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["product", "expand"]

_FAST = dict(cache=True, nogil=True, fastmath=True)


@njit(**_FAST)
def _dot_rows(buf, x, out, column):
    """out[:, column] = x [N, cols] @ buf [cols]: four activation rows per pass over the buffer."""
    n, cols = x.shape
    b = 0
    while b + 4 <= n:
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        for j in range(cols):
            w = buf[j]
            a0 += w * x[b, j]
            a1 += w * x[b + 1, j]
            a2 += w * x[b + 2, j]
            a3 += w * x[b + 3, j]
        out[b, column] = a0
        out[b + 1, column] = a1
        out[b + 2, column] = a2
        out[b + 3, column] = a3
        b += 4
    while b < n:
        acc = np.float32(0.0)
        for j in range(cols):
            acc += buf[j] * x[b, j]
        out[b, column] = acc
        b += 1


@njit(cache=True, nogil=True)
def product(expand_row, data, scales, f16, run, x, start, stop, out):
    """out [N, stop-start] = x [N, cols] @ W[start:stop].T, W's rows expanded by ``expand_row``.

    Args:
        expand_row: a row expander of kestrel_trio._kernels.rows.
        data, scales, f16, run: its storage, scales, float16 table and inner run (kestrel_trio._kernels.rows).
        x: float32 [N, cols], C-contiguous.
        start, stop: the weight rows to multiply.
        out: float32 [N, stop-start], any strides (a column range of a larger result).
    """
    buf = np.empty(x.shape[1], np.float32)  # [cols] one row of weights
    for r in range(start, stop):
        expand_row(data[r], scales[r], f16, run, buf)
        _dot_rows(buf, x, out, r - start)


@njit(cache=True, nogil=True)
def expand(expand_row, data, scales, f16, run, start, stop, out):
    """out [stop-start, cols] = W[start:stop] as float32, exactly (out C-contiguous rows)."""
    for r in range(start, stop):
        expand_row(data[r], scales[r], f16, run, out[r - start])


@njit(**_FAST)
def dense_product(weight, x, start, stop, out):
    """out [N, stop-start] = x [N, cols] @ weight[start:stop].T for float32 weights [rows, cols], row by row.

    The same four-rows-a-pass dot as the packed products, on rows already
    float32: for a few activation rows it reads each weight once and never
    packs it (OpenBLAS's Haswell GEMM packs every block of a small-M product).
    """
    for r in range(start, stop):
        _dot_rows(weight[r], x, out, r - start)
