"""GGUF's k-quants: super-blocks of 256 weights in eight sub-blocks of 32, each with its own 6-bit (Q4_K, Q5_K)
or int8 (Q6_K) scale.

* Q4_K, 144 bytes: fp16 d, fp16 dmin, 12 bytes packing eight 6-bit scales and
  mins, 128 bytes of nibbles; w = (d * scale) * q - dmin * min.
* Q5_K, 176 bytes: as Q4_K with 32 bytes of fifth bits after the scales.
* Q6_K, 210 bytes: 128 bytes of low nibbles, 64 of 2-bit high pairs, 16 int8
  scales, fp16 d; w = (d * scale) * (q - 32).

The byte layouts in full: kestrel_trio._model.forms.dequant.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kestrel_trio._kernels.portable.forms.bits import _EXACT, _half

__all__ = ["BLOCKS", "row_q4_k", "row_q5_k", "row_q6_k"]

Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES = 144, 176, 210  # a super-block's bytes
BLOCKS = {"Q4_K": (256, Q4_K_BYTES), "Q5_K": (256, Q5_K_BYTES), "Q6_K": (256, Q6_K_BYTES)}  # form -> (weights, bytes)


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
        at = Q4_K_BYTES * block
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
        at = Q5_K_BYTES * block
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
        at = Q6_K_BYTES * block
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


@njit(nogil=True, fastmath=True)
def _one_pass_q4_k(data, f16, run, x, start, stop, out):
    """As _one_pass_q4_1 for Q4_K rows: each 32 bytes of nibbles, two sub-blocks' weights as row_q4_k makes them."""
    n, cols = x.shape
    for r in range(start, stop):
        row = data[r]
        for b in range(n):
            xb = x[b]
            total = np.float32(0.0)
            for block in range(cols // 256):
                at = Q4_K_BYTES * block
                for pair in range(4):  # sub-block 2 * pair in the low nibbles, 2 * pair + 1 in the high
                    d_low, offset_low = _k_affine(row, at, f16, 2 * pair)
                    d_high, offset_high = _k_affine(row, at, f16, 2 * pair + 1)
                    nibbles = row[at + 16 + 32 * pair : at + 48 + 32 * pair]
                    first = 256 * block + 64 * pair
                    low, high = xb[first : first + 32], xb[first + 32 : first + 64]
                    acc = np.float32(0.0)
                    for i in range(run):
                        byte = np.int32(nibbles[i])
                        acc += ((d_low * np.float32(byte & 15) + offset_low) * low[i]
                                + (d_high * np.float32(byte >> 4) + offset_high) * high[i])
                    total += acc
            out[b, r - start] = total
