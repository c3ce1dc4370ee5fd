"""kestrel_trio's own quantized copies: int8 (one float32 scale a row) and int4 (two weights a byte, a float16
scale a group).

int8: byte j is weight j, w = scale * q. int4: byte j holds weight j (low
nibble) and weight j + cols/2 (high nibble), 4-bit two's complement, each
scaled by its group's float16 scale. Both take one pass below four activation
rows (int4 where each half is whole groups); :func:`_int8_rows` is
product_int8's whole loop, which the x86-64 assembly blocks take for the rows
their blocks leave (kestrel_trio._kernels.x86.float32.blocks).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kestrel_trio._kernels.portable.forms.bits import _EXACT
from kestrel_trio._kernels.portable.forms.dots import _multiply

__all__ = ["row_int4", "row_int8"]


@njit(**_EXACT)
def _int4_low(byte):
    """The 4-bit two's complement value in the low nibble of ``byte`` (int32)."""
    return (byte & np.int32(15)) - np.int32(16) * ((byte >> np.int32(3)) & np.int32(1))


@njit(**_EXACT)
def _int4_high(byte):
    """The 4-bit two's complement value in the high nibble of ``byte`` (int32, 0-255)."""
    return (byte >> np.int32(4)) - np.int32(16) * (byte >> np.int32(7))


@njit(**_EXACT)
def row_int8(row, scales, f16, run, buf):  # row: int8 [cols]; scales: float32 [1]
    s = scales[0]
    for j in range(buf.size):
        buf[j] = np.float32(row[j]) * s  # w = scale * q


@njit(**_EXACT)
def row_int4(row, halves, f16, run, buf):  # row: uint8 [cols/2]; halves: the float16 scales' bits [cols/group]
    """Byte j holds weight j (low nibble) and weight j + cols/2 (high nibble), 4-bit two's complement."""
    half = row.size
    group = buf.size // halves.size
    if half % group:  # the high nibbles' groups straddle the low ones': weight by weight
        for j in range(half):
            v = np.int32(row[j])
            buf[j] = np.float32(_int4_low(v)) * f16[halves[j // group]]
            buf[j + half] = np.float32(_int4_high(v)) * f16[halves[(j + half) // group]]
        return
    groups = half // group
    for g in range(groups):
        first = g * group
        low, high = buf[first : first + group], buf[half + first : half + first + group]
        source = row[first : first + group]
        s_low, s_high = f16[halves[g]], f16[halves[g + groups]]
        for i in range(group):  # int32 arithmetic and separate views: LLVM vectorizes it (0.29 ns a weight, not 0.9)
            v = np.int32(source[i])
            low[i] = np.float32(_int4_low(v)) * s_low
            high[i] = np.float32(_int4_high(v)) * s_high


@njit(nogil=True, fastmath=True)
def _one_pass_int8(data, scales, x, start, stop, out):
    """out[:, :stop-start] = x [N, cols] @ W[start:stop].T for int8 rows ``data`` with float32 ``scales`` [rows, 1]."""
    n, cols = x.shape
    for r in range(start, stop):
        row = data[r]
        s = scales[r, 0]
        for b in range(n):
            xb = x[b]
            acc = np.float32(0.0)
            for j in range(cols):
                acc += (np.float32(row[j]) * s) * xb[j]  # w = scale * q, as row_int8
            out[b, r - start] = acc


@njit(nogil=True, fastmath=True)
def _one_pass_int4(data, halves, f16, x, start, stop, out):
    """As _one_pass_bf16 for int4 rows (row_int4's layout) whose high nibbles' groups line up with the low ones'."""
    n, cols = x.shape
    half = cols // 2
    group = cols // halves.shape[1]
    groups = half // group  # of the low nibbles; the high ones' follow
    for r in range(start, stop):
        row = data[r]
        scale_bits = halves[r]
        for b in range(n):
            xb = x[b]
            total = np.float32(0.0)
            for g in range(groups):
                first = g * group
                source = row[first : first + group]
                low, high = xb[first : first + group], xb[half + first : half + first + group]
                s_low, s_high = f16[scale_bits[g]], f16[scale_bits[g + groups]]
                acc = np.float32(0.0)
                for i in range(group):
                    v = np.int32(source[i])
                    acc += (np.float32(_int4_low(v)) * s_low) * low[i] + (np.float32(_int4_high(v)) * s_high) * high[i]
                total += acc
            out[b, r - start] = total


@njit(nogil=True)
def _int8_rows(data, scales, f16, run, x, start, stop, out):
    """product_int8's loops (product_int8_avx2 takes them for what its blocks leave)."""
    if x.shape[0] < 4:
        _one_pass_int8(data, scales, x, start, stop, out)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_int8(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)
