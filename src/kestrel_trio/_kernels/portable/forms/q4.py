"""GGUF's Q4_0 and Q4_1: blocks of 32 weights in 16 bytes of nibbles (weight i in byte i's low nibble, weight
i + 16 in its high one) after an fp16 d (Q4_0: 18 bytes, w = d * (q - 8)) or an fp16 d and an fp16 m (Q4_1: 20
bytes, w = d * q + m)."""

from __future__ import annotations

import numpy as np
from numba import njit

from kestrel_trio._kernels.portable.forms.bits import _EXACT, _half

__all__ = ["BLOCKS", "row_q4_0", "row_q4_1"]

Q4_0_BYTES, Q4_1_BYTES = 18, 20  # a block's bytes
BLOCKS = {"Q4_0": (32, Q4_0_BYTES), "Q4_1": (32, Q4_1_BYTES)}  # form -> (weights a block, bytes a block)


@njit(**_EXACT)
def row_q4_0(row, scales, f16, run, buf):  # blocks of 18 bytes: fp16 d, 16 bytes of nibbles
    for block in range(buf.size // 32):
        at = Q4_0_BYTES * block
        d = _half(row, at, f16)
        for i in range(run // 2):
            byte = np.int32(row[at + 2 + i])
            buf[32 * block + i] = np.float32((byte & 15) - 8) * d  # w = d * (q - 8)
            buf[32 * block + 16 + i] = np.float32((byte >> 4) - 8) * d


@njit(**_EXACT)
def row_q4_1(row, scales, f16, run, buf):  # blocks of 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles
    for block in range(buf.size // 32):
        at = Q4_1_BYTES * block
        d = _half(row, at, f16)
        m = _half(row, at + 2, f16)
        for i in range(run // 2):
            byte = np.int32(row[at + 4 + i])
            buf[32 * block + i] = np.float32(byte & 15) * d + m  # w = d * q + m, two roundings as ggml
            buf[32 * block + 16 + i] = np.float32(byte >> 4) * d + m


@njit(nogil=True, fastmath=True)
def _one_pass_q4_0(data, f16, run, x, start, stop, out):
    """As _one_pass_q8_0 for Q4_0 rows: d times the block's sum of (q - 8) * x."""
    n, cols = x.shape
    half = run // 2
    for r in range(start, stop):
        row = data[r]
        for b in range(n):
            xb = x[b]
            total = np.float32(0.0)
            for block in range(cols // 32):
                at = Q4_0_BYTES * block
                qs = row[at + 2 : at + Q4_0_BYTES]
                low, high = xb[32 * block : 32 * block + 16], xb[32 * block + 16 : 32 * block + 32]
                acc = np.float32(0.0)
                for i in range(half):
                    byte = np.int32(qs[i])
                    acc += np.float32((byte & 15) - 8) * low[i] + np.float32((byte >> 4) - 8) * high[i]
                total += _half(row, at, f16) * acc
            out[b, r - start] = total


@njit(nogil=True, fastmath=True)
def _one_pass_q4_1(data, f16, run, x, start, stop, out):
    """As _one_pass_q8_0 for Q4_1 rows, each weight d * q + m as row_q4_1 makes it (factoring m out of the
    block's sum would cancel where m is large against the weights)."""
    n, cols = x.shape
    half = run // 2
    for r in range(start, stop):
        row = data[r]
        for b in range(n):
            xb = x[b]
            total = np.float32(0.0)
            for block in range(cols // 32):
                at = Q4_1_BYTES * block
                d, m = _half(row, at, f16), _half(row, at + 2, f16)
                qs = row[at + 4 : at + Q4_1_BYTES]
                low, high = xb[32 * block : 32 * block + 16], xb[32 * block + 16 : 32 * block + 32]
                acc = np.float32(0.0)
                for i in range(half):
                    byte = np.int32(qs[i])
                    acc += (np.float32(byte & 15) * d + m) * low[i] + (np.float32(byte >> 4) * d + m) * high[i]
                total += acc
            out[b, r - start] = total
