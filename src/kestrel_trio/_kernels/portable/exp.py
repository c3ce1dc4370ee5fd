"""The exponentials of softmax and SiLU in compiled loops that vectorize (numba), and one decode query's attention.

numpy 2's float32 ``np.exp`` runs scalar where the CPU lacks AVX-512: 2.3-2.5
ns an element on the 2-core Zen 3 (AVX2), in L1. A prefill's attention
scores and SwiGLU gates are tens of millions of exponentials, so that was
about a quarter of attention's time and most of SwiGLU's. Here the
exponential is a polynomial LLVM can vectorize (:func:`_exp`: Cody-Waite
reduction to r = x - n ln 2, |r| <= ln 2 / 2, a degree-5 polynomial for
e^r, n added to the exponent bits), within 1.02 ulp of e^x wherever it is
a normal float (measured at 5 M points from -87.3 to 88.7; mean 0.27 ulp); 0 below -87.34 (where np.exp gives
a subnormal, below 1.2e-38), inf above 88.72 and NaN for NaN, as np.exp.

The loops are compiled with reassociation (vector sums and maxima) but
without LLVM's no-NaN / no-infinity assumptions (masked scores are -inf),
the exponential itself without reassociation (its Horner order is its
accuracy), and with numpy's error model: Python's, which checks every
division for zero, keeps LLVM from vectorizing a loop that divides.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["softmax_numerators", "softmax_shifted", "swiglu", "decode_attention"]

_FAST = dict(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "nsz", "contract", "arcp"})

_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)  # ln 2 in two parts: n * _LN2_HI is exact for |n| <= 2^8
_LN2_LO = np.float32(-2.12194440e-4)
_LOWEST = np.float32(-87.3365448)  # below, e^x is subnormal or 0: 0
_HIGHEST = np.float32(88.7228394)  # above, e^x overflows: inf
# Cephes' minimax polynomial for e^r - 1 - r over |r| <= ln 2 / 2, divided by r^2.
_P0, _P1, _P2 = np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3)
_P3, _P4, _P5 = np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1)


@intrinsic
def _float_of(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits`` (a bitcast, no conversion)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def _bits_of(typingctx, value):
    """The bit pattern of the float32 ``value``, as an int32."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@njit(nogil=True, cache=True, error_model="numpy", fastmath={"contract"})  # no reassociation: Horner's order
def _exp(x):
    """e^x for float32 ``x`` (see the module's docstring for range and accuracy)."""
    clamped = min(max(x, np.float32(-87.5)), np.float32(88.5))  # finite (NaN -> -87.5): n converts defined
    n = np.floor(clamped * _LOG2E + np.float32(0.5))
    r = x - n * _LN2_HI - n * _LN2_LO  # from x itself, so that NaN stays NaN
    p = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    y = p * r * r + r + np.float32(1.0)  # e^r, in [0.7, 1.42]
    # * 2^n, added to y's exponent field: an integer sum, which fastmath's reassociation cannot turn into y * inf
    scaled = _float_of(_bits_of(y) + (np.int32(n) << 23))
    if x < _LOWEST:
        return np.float32(0.0)
    if x > _HIGHEST:
        return np.float32(np.inf)
    return scaled


@njit(**_FAST)
def softmax_numerators(scores, sums):
    """Each row of ``scores`` [R, S] (float32, C-contiguous) to e^(s - its max), in place; ``sums`` [R] their sums."""
    rows, width = scores.shape
    for i in range(rows):
        top = np.float32(-np.inf)
        for j in range(width):
            top = max(top, scores[i, j])
        sums[i] = _shifted_row(scores, i, top)


@njit(**_FAST)
def softmax_shifted(scores, tops, sums):
    """As :func:`softmax_numerators`, each row's maximum given in ``tops`` [R].

    LLVM does not vectorize the maximum loop above (a float max reduction without no-NaN), which took 0.8 ns an
    element, twice the exponentials' pass; numpy's ``max`` over the rows does (0.26 ns, 2-core Xeon, AVX-512).
    """
    for i in range(scores.shape[0]):
        sums[i] = _shifted_row(scores, i, tops[i])


@njit(**_FAST)
def _shifted_row(scores, i, top):
    """Row ``i`` of ``scores`` to e^(s - top), in place; their sum."""
    total = np.float32(0.0)
    for j in range(scores.shape[1]):
        e = _exp(scores[i, j] - top)
        scores[i, j] = e
        total += e
    return total


@njit(**_FAST)
def swiglu(gate_up, out):
    """``out`` [N, D] = silu(gate) * up = gate / (1 + e^-gate) * up, gate and up the halves of ``gate_up`` [N, 2D].

    Both C-contiguous: with the halves as strided views LLVM cannot vectorize.
    """
    rows, width = out.shape
    for i in range(rows):
        for j in range(width):
            g = gate_up[i, j]
            out[i, j] = g / (np.float32(1.0) + _exp(-g)) * gate_up[i, width + j]


@njit(**_FAST)
def decode_attention(q, keys, values, total, first, stop, scale, out):
    """One query's grouped attention: rows of ``out`` [n_heads, hd] over the first ``total`` of ``keys``, ``values``.

    ``q`` [n_heads, hd]; scores are ``(q * scale) . k``, the query scaled once (one float32 product, as
    numpy's ``q * scale``). ``keys``, ``values`` [n_kv, capacity, hd], C-contiguous (a KV cache's whole buffers:
    as prefix views LLVM could not vectorize the rows). Query head h reads kv head h // group (group = n_heads /
    n_kv); only the heads of kv heads [first, stop) are computed, so that threads can share one query's heads.
    The scratch is allocated here: as numpy arrays passed in, it cost a decode step's layer more in calls
    than the attention itself over a short context.

    Each key and value row is read once for all the query heads of its group: a long context's cache does
    not stay in L2 between two heads, so reading it once a head would read the
    cache ``group`` times from memory. Measured on the 2-core Zen 5, Qwen3-0.6B's 16 heads over 8 kv heads
    of 128, one thread: over 4,096 keys 1.35 ms against 2.0 ms; over 64 keys the same, 12-16 us (numpy's
    dozen calls over 40 keys: 79 us).
    """
    n_heads, hd = q.shape
    group = n_heads // keys.shape[0]
    scaled = np.empty((group, hd), dtype=np.float32)  # [group, hd]
    scores = np.empty((group, total), dtype=np.float32)  # [group, total], C-contiguous for softmax_numerators
    norms = np.empty(group, dtype=np.float32)  # [group]
    sums = np.empty((group, hd), dtype=np.float32)  # [group, hd]
    for kv in range(first, stop):
        h0 = kv * group
        for g in range(group):
            for d in range(hd):
                scaled[g, d] = q[h0 + g, d] * scale
        for j in range(total):
            for g in range(group):
                s = np.float32(0.0)
                for d in range(hd):
                    s += scaled[g, d] * keys[kv, j, d]
                scores[g, j] = s
        softmax_numerators(scores, norms)
        sums[:, :] = np.float32(0.0)
        for j in range(total):
            for g in range(group):
                weight = scores[g, j]
                for d in range(hd):
                    sums[g, d] += weight * values[kv, j, d]
        for g in range(group):
            for d in range(hd):
                out[h0 + g, d] = sums[g, d] / norms[g]
