"""GGUF's Q8_0: blocks of 34 bytes (fp16 d, 32 int8 q) holding 32 weights, w = d * q."""

from __future__ import annotations

import numpy as np
from numba import njit

from kestrel_trio._kernels.portable.forms.bits import _EXACT, _half

__all__ = ["BLOCKS", "row_q8_0"]

Q8_0_BYTES = 34  # a block's bytes
BLOCKS = {"Q8_0": (32, Q8_0_BYTES)}  # form -> (weights a block, bytes a block)


@njit(**_EXACT)
def _q8_signed(byte):
    """The int8 a stored byte holds, in an int32 lane: (b ^ 128) - 128 (an int8 view vectorized worse)."""
    return (np.int32(byte) ^ np.int32(128)) - np.int32(128)


@njit(**_EXACT)
def row_q8_0(row, scales, f16, run, buf):  # blocks of 34 bytes: fp16 d, 32 int8 q
    for block in range(buf.size // 32):
        at = Q8_0_BYTES * block
        d = _half(row, at, f16)
        for i in range(run):
            buf[32 * block + i] = np.float32(_q8_signed(row[at + 2 + i])) * d


@njit(nogil=True, fastmath=True)
def _one_pass_q8_0(data, f16, run, x, start, stop, out):
    """As _one_pass_bf16 for Q8_0 rows: each block's d times its sum of q * x (``run``: 32, not a constant, so
    LLVM vectorizes the block's loop rather than the loop over blocks, which took byte gathers)."""
    n, cols = x.shape
    for r in range(start, stop):
        row = data[r]
        for b in range(n):
            xb = x[b]
            total = np.float32(0.0)
            for block in range(cols // 32):
                at = Q8_0_BYTES * block
                qs = row[at + 2 : at + Q8_0_BYTES]  # slices indexed by range(run): no negative-index wraparound
                xs = xb[32 * block : 32 * block + 32]
                acc = np.float32(0.0)
                for i in range(run):
                    acc += np.float32(_q8_signed(qs[i])) * xs[i]
                total += _half(row, at, f16) * acc
            out[b, r - start] = total
