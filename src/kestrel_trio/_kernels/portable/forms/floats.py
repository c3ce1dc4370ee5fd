"""Weights stored as floats: F32 (float32, multiplied in place), F16 (float16 bits, looked up in the f16
table) and bf16 / BF16 (the top half of a float32: a kestrel_trio bf16 copy, a GGUF's BF16 tensor).

Each holds one value an item (no blocks). bf16 rows below four activation
rows take one pass (:func:`_one_pass_bf16`); :func:`_bf16_rows` is
product_bf16's whole loop, which the x86-64 assembly blocks take for the rows
their blocks leave (kestrel_trio._kernels.x86.float32.blocks).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kestrel_trio._kernels.portable.forms.bits import _EXACT, _bits_as_float32
from kestrel_trio._kernels.portable.forms.dots import _multiply

__all__ = ["row_bf16", "row_f16", "row_f32"]


@njit(**_EXACT)
def _bf16_value(bits):
    """The float32 a bf16's bits hold: its top half, exactly."""
    return _bits_as_float32(np.uint32(bits) << np.uint32(16))


@njit(**_EXACT)
def row_bf16(row, scales, f16, run, buf):  # row: uint16 [cols], the bf16 bits
    # bf16 is the top half of a float32: exact. Written as floats rather than as bits through a uint32 view of
    # buf, which ran 1.4x slower (Zen 4).
    for j in range(buf.size):
        buf[j] = _bf16_value(row[j])


@njit(**_EXACT)
def row_f32(row, scales, f16, run, buf):  # row: float32 [cols]
    buf[:] = row


@njit(**_EXACT)
def row_f16(row, scales, f16, run, buf):  # row: uint16 [cols], the float16 bits
    for j in range(buf.size):
        buf[j] = f16[row[j]]


@njit(nogil=True, fastmath=True)
def _one_pass_bf16(data, x, start, stop, out):
    """out[:, :stop-start] = x [N, cols] @ W[start:stop].T for bf16 rows ``data`` (uint16 [rows, cols])."""
    n, cols = x.shape
    for r in range(start, stop):
        row = data[r]
        for b in range(n):
            xb = x[b]
            acc = np.float32(0.0)
            for j in range(cols):
                acc += _bf16_value(row[j]) * xb[j]
            out[b, r - start] = acc


@njit(nogil=True)
def _bf16_rows(data, scales, f16, run, x, start, stop, out):
    """product_bf16's loops (product_bf16_avx2 takes them for what its blocks leave)."""
    if x.shape[0] < 4:
        _one_pass_bf16(data, x, start, stop, out)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_bf16(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)
