"""Row expanders: one weight row of a packed form written as its float32 weights into a buffer.

Each ``row_<form>(row, scales, f16, run, buf)`` writes one row of a packed
matrix into ``buf`` (float32 [cols]) with the same float32 operations, in
the same order, as the numpy expansion (kestrel_trio._model.dequant,
kestrel_trio._model.packed), so the weights equal ggml's and ``gguf``'s bit
for bit. That is why these are compiled without fastmath: a contracted
``d * q + m`` (one fused multiply-add) would round differently.

All expanders share one signature:

* ``row``: the row's storage, contiguous (so that LLVM sees unit strides and
  vectorizes): int8 (int8), uint16 bits (bf16, F16, BF16), float32 (F32) or
  the ggml blocks' bytes, uint8.
* ``scales``: the row's scales: int8's float32 [1], else empty (unused).
* ``f16``: float32 [65536], every float16 bit pattern's value (numba has no
  float16 type; a table lookup is exact).
* ``run``: 32, the length of a block's inner loops, passed at run time: with
  a constant trip count LLVM unrolls those loops into scalar code before it
  can vectorize them (measured on Q8_0: 0.33 ns a weight unrolled, 0.17
  vectorized).
* ``buf``: float32 [cols], the row's weights out.

ggml block layouts are described in kestrel_trio._model.dequant.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["f16_table", "row_int8", "row_bf16", "row_f32", "row_f16", "row_q8_0", "row_q4_0", "row_q4_1",
           "row_q4_k", "row_q5_k", "row_q6_k"]

_EXACT = dict(nogil=True, fastmath=False)


def f16_table() -> np.ndarray:
    """Every float16 bit pattern's float32 value: float32 [65536]."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)  # [65536]


@njit(**_EXACT)
def _half(row, at, f16):
    """The little-endian float16 at byte ``at``, as float32."""
    return f16[np.int32(row[at]) | (np.int32(row[at + 1]) << 8)]


@njit(**_EXACT)
def row_int8(row, scales, f16, run, buf):  # row: int8 [cols]; scales: float32 [1]
    s = scales[0]
    for j in range(buf.size):
        buf[j] = np.float32(row[j]) * s  # w = scale * q


@njit(**_EXACT)
def row_bf16(row, scales, f16, run, buf):  # row: uint16 [cols], the bf16 bits
    bits = buf.view(np.uint32)
    for j in range(buf.size):
        bits[j] = np.uint32(row[j]) << 16  # bf16 is the top half of a float32: exact


@njit(**_EXACT)
def row_f32(row, scales, f16, run, buf):  # row: float32 [cols]
    buf[:] = row


@njit(**_EXACT)
def row_f16(row, scales, f16, run, buf):  # row: uint16 [cols], the float16 bits
    for j in range(buf.size):
        buf[j] = f16[row[j]]


@njit(**_EXACT)
def row_q8_0(row, scales, f16, run, buf):  # blocks of 34 bytes: fp16 d, 32 int8 q
    quants = row.view(np.int8)
    for block in range(buf.size // 32):
        at = 34 * block
        d = _half(row, at, f16)
        for i in range(run):
            buf[32 * block + i] = np.float32(quants[at + 2 + i]) * d  # w = q * d


@njit(**_EXACT)
def row_q4_0(row, scales, f16, run, buf):  # blocks of 18 bytes: fp16 d, 16 bytes of nibbles
    for block in range(buf.size // 32):
        at = 18 * block
        d = _half(row, at, f16)
        for i in range(run // 2):
            byte = np.int32(row[at + 2 + i])
            buf[32 * block + i] = np.float32((byte & 15) - 8) * d  # w = d * (q - 8)
            buf[32 * block + 16 + i] = np.float32((byte >> 4) - 8) * d


@njit(**_EXACT)
def row_q4_1(row, scales, f16, run, buf):  # blocks of 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles
    for block in range(buf.size // 32):
        at = 20 * block
        d = _half(row, at, f16)
        m = _half(row, at + 2, f16)
        for i in range(run // 2):
            byte = np.int32(row[at + 4 + i])
            buf[32 * block + i] = np.float32(byte & 15) * d + m  # w = d * q + m, two roundings as ggml
            buf[32 * block + 16 + i] = np.float32(byte >> 4) * d + m


@njit(**_EXACT)
def _k_scale_min(row, at, j):
    """Q4_K/Q5_K: sub-block ``j``'s 6-bit scale and min from the 12 bytes at ``at``."""
    if j < 4:
        return np.int32(row[at + j]) & 63, np.int32(row[at + j + 4]) & 63
    packed = np.int32(row[at + j + 4])
    scale = (packed & 15) | ((np.int32(row[at + j - 4]) >> 6) << 4)
    low_min = (packed >> 4) | ((np.int32(row[at + j]) >> 6) << 4)
    return scale, low_min


@njit(**_EXACT)
def _k_affine(row, at, f16, j):
    """Q4_K/Q5_K sub-block ``j`` of the super-block at ``at``: (d * scale, -(dmin * min)), ggml's roundings."""
    scale, low_min = _k_scale_min(row, at + 4, j)
    return _half(row, at, f16) * np.float32(scale), np.float32(low_min) * -_half(row, at + 2, f16)


@njit(**_EXACT)
def row_q4_k(row, scales, f16, run, buf):  # super-blocks of 144 bytes: d, dmin, 12 scale bytes, 128 of nibbles
    for block in range(buf.size // 256):
        at = 144 * block
        for pair in range(4):  # 32 bytes: sub-block 2 * pair in the low nibbles, 2 * pair + 1 in the high
            d_low, offset_low = _k_affine(row, at, f16, 2 * pair)
            d_high, offset_high = _k_affine(row, at, f16, 2 * pair + 1)
            nibbles = at + 16 + 32 * pair
            first = 256 * block + 64 * pair
            for i in range(run):
                byte = np.int32(row[nibbles + i])
                buf[first + i] = d_low * np.float32(byte & 15) + offset_low  # (d * scale) * q - dmin * min
                buf[first + 32 + i] = d_high * np.float32(byte >> 4) + offset_high


@njit(**_EXACT)
def row_q5_k(row, scales, f16, run, buf):  # super-blocks of 176 bytes: as Q4_K with 32 bytes of fifth bits at 16
    for block in range(buf.size // 256):
        at = 176 * block
        for pair in range(4):
            d_low, offset_low = _k_affine(row, at, f16, 2 * pair)
            d_high, offset_high = _k_affine(row, at, f16, 2 * pair + 1)
            nibbles = at + 48 + 32 * pair
            first = 256 * block + 64 * pair
            for i in range(run):
                byte = np.int32(row[nibbles + i])
                fifth = np.int32(row[at + 16 + i]) >> (2 * pair)  # bit j of byte i: weight i of sub-block j
                q_low = (byte & 15) | ((fifth & 1) << 4)
                q_high = (byte >> 4) | ((fifth & 2) << 3)
                buf[first + i] = d_low * np.float32(q_low) + offset_low
                buf[first + 32 + i] = d_high * np.float32(q_high) + offset_high


@njit(**_EXACT)
def row_q6_k(row, scales, f16, run, buf):  # super-blocks of 210 bytes: 128 low, 64 high, 16 int8 scales, fp16 d
    signed = row.view(np.int8)
    for block in range(buf.size // 256):
        at = 210 * block
        d = _half(row, at + 208, f16)
        for half in range(2):  # 128 weights: 64 bytes of nibbles (ql), 32 of 2-bit pairs (qh), 8 scales
            ql = at + 64 * half
            qh = at + 128 + 32 * half
            sc = at + 192 + 8 * half
            first = 256 * block + 128 * half
            for part in range(2):  # l in [16 part, 16 part + 16): weights l, l+32, l+64, l+96, scales part + 2k
                d0 = d * np.float32(signed[sc + part])
                d1 = d * np.float32(signed[sc + part + 2])
                d2 = d * np.float32(signed[sc + part + 4])
                d3 = d * np.float32(signed[sc + part + 6])
                for i in range(run // 2):
                    l = 16 * part + i
                    a = np.int32(row[ql + l])
                    b = np.int32(row[ql + l + 32])
                    h = np.int32(row[qh + l])
                    buf[first + l] = d0 * np.float32(((a & 15) | ((h & 3) << 4)) - 32)  # (d * scale) * (q - 32)
                    buf[first + l + 32] = d1 * np.float32(((b & 15) | (((h >> 2) & 3) << 4)) - 32)
                    buf[first + l + 64] = d2 * np.float32(((a >> 4) | (((h >> 4) & 3) << 4)) - 32)
                    buf[first + l + 96] = d3 * np.float32(((b >> 4) | (((h >> 6) & 3) << 4)) - 32)



