"""GGUF's Q5_0 and Q5_1: Q4_0's and Q4_1's blocks with a uint32 of fifth bits (bit j: weight j's) before the
nibbles: 22 bytes (fp16 d, w = d * (q - 16)) and 24 bytes (fp16 d, fp16 m, w = d * q + m)."""

from __future__ import annotations

import numpy as np
from numba import njit

from kestrel_trio._kernels.portable.forms.bits import _EXACT, _half, _word

__all__ = ["BLOCKS", "row_q5_0", "row_q5_1"]

Q5_0_BYTES, Q5_1_BYTES = 22, 24  # a block's bytes
BLOCKS = {"Q5_0": (32, Q5_0_BYTES), "Q5_1": (32, Q5_1_BYTES)}  # form -> (weights a block, bytes a block)


@njit(**_EXACT)
def row_q5_0(row, scales, f16, run, buf):  # blocks of 22 bytes: fp16 d, uint32 of fifth bits, 16 of nibbles
    for block in range(buf.size // 32):
        at = Q5_0_BYTES * block
        d = _half(row, at, f16)
        fifth = _word(row, at + 2)  # bit j: weight j's fifth bit
        for i in range(run // 2):
            byte = np.int64(row[at + 6 + i])
            buf[32 * block + i] = np.float32(((byte & 15) | (((fifth >> i) & 1) << 4)) - 16) * d  # d * (q - 16)
            buf[32 * block + 16 + i] = np.float32(((byte >> 4) | (((fifth >> (i + 16)) & 1) << 4)) - 16) * d


@njit(**_EXACT)
def row_q5_1(row, scales, f16, run, buf):  # blocks of 24 bytes: fp16 d, fp16 m, uint32 of fifth bits, nibbles
    for block in range(buf.size // 32):
        at = Q5_1_BYTES * block
        d = _half(row, at, f16)
        m = _half(row, at + 2, f16)
        fifth = _word(row, at + 4)
        for i in range(run // 2):
            byte = np.int64(row[at + 8 + i])
            buf[32 * block + i] = np.float32((byte & 15) | (((fifth >> i) & 1) << 4)) * d + m  # d * q + m
            buf[32 * block + 16 + i] = np.float32((byte >> 4) | (((fifth >> (i + 16)) & 1) << 4)) * d + m
