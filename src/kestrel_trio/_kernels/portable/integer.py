"""Integer dot products of GGUF-quantized weights with activations quantized to int8: the portable reference.

Theory of operation: the exact products expand every quantized weight to
float32 and multiply in float32, about three aarch64 instructions a weight;
llama.cpp, reading the same bytes, spends about a quarter of one. It
quantizes each activation row once, per block of 32, to int8 with one
float32 scale (``d_x = max|x| / 127``, ``q_x = x / d_x`` rounded to nearest,
ties to even, as ggml's NEON and AVX paths round), and takes each block's
product as ``d_w * d_x * sum(q_w * q_x)``, an int32 sum of 32 int8 products
(two ``sdot`` on a CPU with dotprod); Q4_1's minimum adds ``m_w * s_x``, the
block's activation sum ``s_x = d_x * sum(q_x)``; Q4_K's blocks of 256 are
eight sub-blocks of 32, each with its 6-bit scale and minimum (``d * scale``,
``min * -dmin``), taken as eight blocks of 32 against the activations' own.
Q5_0, Q5_1 and Q5_K are Q4_0, Q4_1 and Q4_K with a fifth bit a weight (Q5_0
less 16 instead of 8). Q6_K's blocks of 256 have an int8 scale a 16 weights
and one float16 ``d``: each 16 weights' int32 sum is multiplied by its scale
in int32 (exact: below 2**24, so exact in float32 too), the two halves of a
32-block added, and ``d * d_x`` applied once a 32 weights, as for the others;
llama.cpp's Q6_K x Q8_K product scales its 16-weight sums in integers too.

These loops fix that arithmetic for every kernel (kestrel_trio._kernels.arm,
kestrel_trio._kernels.x86): one int32 sum a row and block (a kernel adds its
``sdot`` lanes, in any grouping), converted to float32 and accumulated into one
float32 a row by a fused multiply-add, the row's value that accumulator. One
accumulator a row lets a kernel keep four rows' in one vector: their block sums
reduced into one int32x4 (``addp``), their four scales converted and multiplied
at once, one ``fmla`` a block for all four. Integer sums are exact in any order and every float32 step is
written out (no fastmath), so each kernel equals these loops bit for bit on
every CPU. The results differ from the exact products by the activations'
rounding (about 1/254 of an activation, averaging down over a row), as
llama.cpp's do.

Weights are the GGUF rows as stored (uint8 blocks: float16 ``d``, Q4_1's
float16 ``m``, then the quants), read in place. The float16 lookup and the
weights' decoding are written out here rather than called from products.py:
numba invalidates a cached function when its own file changes, not when a
function it calls from another file does.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["quantize_q8_rows", "block_sums", "quantize_rows", "product_blocks"]


@njit(nogil=True, cache=True)
def quantize_q8_rows(x, run, xq, xd):
    """Each row of ``x`` float32 [N, cols] in blocks of ``run`` (32): ``xq`` int8 [N, cols], ``xd`` float32
    [N, cols / run] with ``x ~= xq * xd`` per block (a block of zeros: scale 0, quants 0)."""
    n, cols = x.shape
    for b in range(n):
        for block in range(cols // run):
            first = block * run
            amax = np.float32(0.0)
            for i in range(run):
                amax = max(amax, abs(x[b, first + i]))
            d = amax / np.float32(127.0)
            inverse = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            xd[b, block] = d
            for i in range(run):
                xq[b, first + i] = np.int8(np.rint(x[b, first + i] * inverse))


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` (float32) rounded once: LLVM's fma, as NEON's ``fmla`` and x86's ``vfmadd`` compute it."""
    def codegen(context, builder, signature, args):
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 3),
                                             "llvm.fma.f32")
        return builder.call(fma, args)
    if a == b == c == types.float32:
        return types.float32(a, b, c), codegen
    return None


@njit(nogil=True, cache=True)
def block_sums(xq, xd, run, xs):
    """``xs`` float32 [N, cols / run]: each block's activation sum as its quants give it, ``d_x * sum(q_x)``
    (Q4_1's minimum multiplies it, as llama.cpp's Q8_1 activations carry it)."""
    for b in range(xq.shape[0]):
        for block in range(xq.shape[1] // run):
            total = np.int32(0)
            for i in range(block * run, block * run + run):
                total += np.int32(xq[b, i])
            xs[b, block] = xd[b, block] * np.float32(total)


@njit(nogil=True, cache=True)
def quantize_rows(x, run, xq, xd, xs, sums):
    """:func:`quantize_q8_rows` and, with ``sums``, :func:`block_sums` into ``xs`` in one compiled call: a decode
    step's quantization into its own buffers (kestrel_trio._model.decoder.decode_step), the same arithmetic bit for bit.
    Beside them in this file, as numba re-validates a cached function when its own file changes only."""
    quantize_q8_rows(x, run, xq, xd)
    if sums:
        block_sums(xq, xd, run, xs)


@njit(nogil=True, cache=True)
def _weight(row, at, form, sub, i):
    """Weight ``i`` (0-31) of 32-weight sub-block ``sub`` of the block at byte ``at``, an int32: Q8_0 (form 0)
    its signed byte, Q4_0 (1) its nibble less 8, Q4_1 (2) its nibble (low nibbles: weights 0-15, high: 16-31),
    Q4_K (3) its nibble (the 32 bytes of sub-block pair ``sub // 2``: low nibbles even sub-blocks, high odd);
    Q5_0 (4) and Q5_1 (5) as Q4_0 and Q4_1 with bit ``i`` of the uint32 after the float16s as the fifth bit (Q5_0:
    less 16), Q5_K (6) as Q4_K with bit ``sub`` of fifth-bit byte ``i``, Q6_K (7) its nibble and two high bits
    less 32 (``sub`` = 4 * half + quarter: the low or high nibble of byte ``i`` of the half's first or second 32
    bytes of nibbles, bits ``2 * quarter``, ``2 * quarter + 1`` of the half's high-bit byte ``i``)."""
    if form == 0:
        return (np.int32(row[at + 2 + i]) ^ np.int32(128)) - np.int32(128)
    if form == 3 or form == 6:
        byte = np.int32(row[at + (16 if form == 3 else 48) + 32 * (sub // 2) + i])
        nibble = (byte >> np.int32(4)) if sub % 2 else (byte & np.int32(15))
        if form == 3:
            return nibble
        return nibble | (((np.int32(row[at + 16 + i]) >> np.int32(sub)) & np.int32(1)) << np.int32(4))
    if form == 7:
        half, quarter = sub // 4, sub % 4
        low = np.int32(row[at + 64 * half + 32 * (quarter % 2) + i])
        nibble = (low >> np.int32(4)) if quarter >= 2 else (low & np.int32(15))
        high = (np.int32(row[at + 128 + 32 * half + i]) >> np.int32(2 * quarter)) & np.int32(3)
        return (nibble | (high << np.int32(4))) - np.int32(32)
    quants = at + (2, 4, 0, 6, 8)[form - 1]
    byte = np.int32(row[quants + (i & 15)])
    nibble = (byte & np.int32(15)) if i < 16 else (byte >> np.int32(4))
    if form == 4 or form == 5:  # the fifth bit: bit i of the little-endian uint32 before the nibbles
        nibble |= ((np.int32(row[quants - 4 + i // 8]) >> np.int32(i % 8)) & np.int32(1)) << np.int32(4)
        return nibble - np.int32(16) if form == 4 else nibble
    return nibble - np.int32(8) if form == 1 else nibble


@njit(nogil=True, cache=True)
def _k_scale_min(row, at, j):
    """Q4_K sub-block ``j``'s 6-bit scale and minimum from the 12 bytes at ``at + 4`` (ggml's packing)."""
    if j < 4:
        return np.int32(row[at + 4 + j]) & 63, np.int32(row[at + 8 + j]) & 63
    packed = np.int32(row[at + 8 + j])
    scale = (packed & 15) | ((np.int32(row[at + j]) >> 6) << 4)
    low_min = (packed >> 4) | ((np.int32(row[at + 4 + j]) >> 6) << 4)
    return scale, low_min


@njit(nogil=True, cache=True)
def _half(row, at, f16):
    return f16[np.int32(row[at]) | (np.int32(row[at + 1]) << 8)]


@njit(nogil=True, cache=True)
def product_blocks(form, data, f16, run, xq, xd, xs, start, stop, out):
    """``out`` [N, stop-start] = the quantized rows ``xq``/``xd`` [N, ...] (quantize_q8_rows; ``xs``, their block
    sums, for the forms with minimums) @ rows ``data`` [start:stop].T of ``form`` (0: Q8_0, 34 bytes a block of
    32; 1: Q4_0, 18; 2: Q4_1, 20; 3: Q4_K, 144 bytes a block of 256; 4: Q5_0, 22; 5: Q5_1, 24; 6: Q5_K, 176 a
    block of 256; 7: Q6_K, 210 a block of 256). Per 32-weight sub-block: the int32 sum of its 32 products (Q6_K:
    each half's sum times its 16 weights' int8 scale, ``s0 * sum(0-15) + s1 * sum(16-31)``, exact: at most 2 *
    16 * 32 * 127 * 128 < 2**24), accumulated as ``acc = fma(float32(sum), scale_w * d_x, acc)`` (scale_w: the
    block's d; Q4_K's and Q5_K's d * scale; Q6_K's d), and where the form has minimums ``bias = fma(offset_w,
    s_x, bias)`` (Q4_1's and Q5_1's m; Q4_K's and Q5_K's min * -dmin); the row's value ``acc`` (``+ bias``)."""
    n = xq.shape[0]
    subs = 8 if form == 3 or form >= 6 else 1
    size = (34, 18, 20, 144, 22, 24, 176, 210)[form]
    has_min = form == 2 or form == 3 or form == 5 or form == 6
    for r in range(start, stop):
        row = data[r]
        for b in range(n):
            quants = xq[b]
            acc = np.float32(0.0)
            bias = np.float32(0.0)
            for k in range(xq.shape[1] // run):
                at, sub = size * (k // subs), k % subs
                first_scale, second_scale = np.int32(1), np.int32(1)  # Q6_K's int8 scales of weights 0-15, 16-31
                if form == 3 or form == 6:
                    scale, low_min = _k_scale_min(row, at, sub)
                    scale_w = _half(row, at, f16) * np.float32(scale)
                    bias = _fma(np.float32(low_min) * -_half(row, at + 2, f16), xs[b, k], bias)
                elif form == 7:
                    scale_w = _half(row, at + 208, f16)
                    first_scale = (np.int32(row[at + 192 + 2 * sub]) ^ np.int32(128)) - np.int32(128)
                    second_scale = (np.int32(row[at + 193 + 2 * sub]) ^ np.int32(128)) - np.int32(128)
                else:
                    scale_w = _half(row, at, f16)
                    if has_min:
                        bias = _fma(_half(row, at + 2, f16), xs[b, k], bias)
                step = scale_w * xd[b, k]
                total = np.int32(0)
                for half in range(2):
                    part = np.int32(0)
                    for i in range(16 * half, 16 * half + 16):
                        part += _weight(row, at, form, sub, i) * np.int32(quants[k * run + i])
                    total += part * (second_scale if half else first_scale)
                acc = _fma(np.float32(total), step, acc)
            out[b, r - start] = acc + bias if has_min else acc
