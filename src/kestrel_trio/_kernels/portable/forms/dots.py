"""The dot loops every form's product shares: a weight row (expanded into a buffer, or float32 as stored) by
the activation rows, four by four, three by eight, or one at a time.

Compiled with fastmath: reassociation lets LLVM keep vector accumulators, so
the sums round differently from BLAS in the last bits (the weights they
multiply are exact: the expanders').
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__: list[str] = []  # the compiled products' loops: kestrel_trio._kernels.portable.products


@njit(nogil=True, fastmath=True)
def _dot_rows(buf, x, out, column, first):
    """out[first:, column] = x[first:] [N-first, cols] @ buf [cols]: four activation rows per pass."""
    n, cols = x.shape
    b = first
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


@njit(nogil=True, fastmath=True)
def _dot_block(w, x, out, column):
    """out[:, column:column+4] = x [N, cols] @ w [4, cols].T: four weight rows by four activation rows a pass.

    Sixteen accumulators, each weight and activation loaded once per four
    multiply-adds (a row at a time it is one load per multiply-add, which
    bounds the product by the loads: 8 rows measured 0.65 ns a weight that
    way, 0.39 this way, on one core).
    """
    n, cols = x.shape
    b = 0
    while b + 4 <= n:
        a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0.0)
        a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = np.float32(0.0)
        for j in range(cols):
            w0 = w[0, j]
            w1 = w[1, j]
            w2 = w[2, j]
            w3 = w[3, j]
            x0 = x[b, j]
            x1 = x[b + 1, j]
            x2 = x[b + 2, j]
            x3 = x[b + 3, j]
            a00 += w0 * x0
            a01 += w0 * x1
            a02 += w0 * x2
            a03 += w0 * x3
            a10 += w1 * x0
            a11 += w1 * x1
            a12 += w1 * x2
            a13 += w1 * x3
            a20 += w2 * x0
            a21 += w2 * x1
            a22 += w2 * x2
            a23 += w2 * x3
            a30 += w3 * x0
            a31 += w3 * x1
            a32 += w3 * x2
            a33 += w3 * x3
        out[b, column], out[b + 1, column], out[b + 2, column], out[b + 3, column] = a00, a01, a02, a03
        out[b, column + 1], out[b + 1, column + 1], out[b + 2, column + 1], out[b + 3, column + 1] = a10, a11, a12, a13
        out[b, column + 2], out[b + 1, column + 2], out[b + 2, column + 2], out[b + 3, column + 2] = a20, a21, a22, a23
        out[b, column + 3], out[b + 1, column + 3], out[b + 2, column + 3], out[b + 3, column + 3] = a30, a31, a32, a33
        b += 4
    if b < n:
        for k in range(4):
            _dot_rows(w[k], x, out, column + k, b)


@njit(nogil=True, fastmath=True)
def _dot_block_3x8(w, x, out, column):
    """out[:, column:column+3] = x [N, cols] @ w [3, cols].T, for N >= 8: three weight rows by eight activation rows.

    24 accumulators, eleven loads per 24 multiply-adds, each weight row read
    once per eight activation rows (the 4x4 block reads it twice for eight).
    Measured on the 2-core Xeon, 2 threads, float32 weights from memory, ns a
    weight: 8 rows 0.179 against 0.196 for 4x4, 16 rows 0.255 against 0.265;
    4x8 spilled at 16 rows (0.443).
    """
    n, cols = x.shape
    b = 0
    while b + 8 <= n:
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
        c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = np.float32(0.0)
        d0 = d1 = d2 = d3 = d4 = d5 = d6 = d7 = np.float32(0.0)
        for j in range(cols):
            w0 = w[0, j]
            w1 = w[1, j]
            w2 = w[2, j]
            x0 = x[b, j]
            x1 = x[b + 1, j]
            x2 = x[b + 2, j]
            x3 = x[b + 3, j]
            x4 = x[b + 4, j]
            x5 = x[b + 5, j]
            x6 = x[b + 6, j]
            x7 = x[b + 7, j]
            a0 += w0 * x0
            a1 += w0 * x1
            a2 += w0 * x2
            a3 += w0 * x3
            a4 += w0 * x4
            a5 += w0 * x5
            a6 += w0 * x6
            a7 += w0 * x7
            c0 += w1 * x0
            c1 += w1 * x1
            c2 += w1 * x2
            c3 += w1 * x3
            c4 += w1 * x4
            c5 += w1 * x5
            c6 += w1 * x6
            c7 += w1 * x7
            d0 += w2 * x0
            d1 += w2 * x1
            d2 += w2 * x2
            d3 += w2 * x3
            d4 += w2 * x4
            d5 += w2 * x5
            d6 += w2 * x6
            d7 += w2 * x7
        for k, (e0, e1, e2, e3, e4, e5, e6, e7) in enumerate(
                ((a0, a1, a2, a3, a4, a5, a6, a7), (c0, c1, c2, c3, c4, c5, c6, c7), (d0, d1, d2, d3, d4, d5, d6, d7))):
            out[b, column + k], out[b + 1, column + k], out[b + 2, column + k], out[b + 3, column + k] = e0, e1, e2, e3
            out[b + 4, column + k], out[b + 5, column + k] = e4, e5
            out[b + 6, column + k], out[b + 7, column + k] = e6, e7
        b += 8
    if b < n:
        for k in range(3):
            _dot_rows(w[k], x, out, column + k, b)


@njit(nogil=True, fastmath=True)
def _multiply(bufs, count, x, out, column):
    """out[:, column:column+count] = x @ bufs[:count].T: a block of four weight rows, or rows one by one."""
    if count == 4 and x.shape[0] >= 4:
        _dot_block(bufs, x, out, column)
    else:
        for k in range(count):
            _dot_rows(bufs[k], x, out, column + k, 0)


@njit(nogil=True)
def _f32_rest(data, x, first, start, stop, out):
    """out[:, first-start:stop-start] = x @ data[first:stop].T: the rows the float32 products' blocks left."""
    step = 4 if x.shape[0] >= 4 else 1
    for first in range(first, stop, step):
        _multiply(data[first : min(first + step, stop)], min(step, stop - first), x, out, first - start)
