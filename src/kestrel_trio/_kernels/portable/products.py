"""Products with packed weights, each weight row expanded once into a small buffer and used while hot.

Theory of operation: a decode step with packed weights (bf16, int8, int4, a
GGUF's blocks) used to expand cache-sized chunks with numpy and multiply them
with BLAS. numpy has no mixed-precision kernel: its int8-to-float32 cast
alone cost about as much as the whole float32 product it was meant to beat
(0.18-0.21 ns a weight against 0.20). Here each row of weights is expanded
by its form's exact expander (below) into a buffer in L1 and multiplied at
once with every activation row (four weight rows by four activation rows a
pass, from four rows up), so the weights are read from memory once, in
their compact form, and expanded once per step whatever the batch. Below
four activation rows (batch-1 decode) the common forms (bf16, int8, Q8_0,
Q4_0, Q4_1, Q4_K, int4) skip the buffer: each weight is expanded in a register
and multiplied at once (the ``_one_pass_*`` loops), so a step reads the
compact rows at close to memory speed instead of the core's pace.

The dot products are compiled with fastmath (reassociation lets LLVM keep
vector accumulators), so they round differently from BLAS in the last bits;
the expanded weights themselves are exact (the expanders, below).

One product per storage form, each with one explicit signature, compiled
at its first use (:func:`product_for`) and cached on disk by numba (a later
process loads it in milliseconds). Any C-contiguous storage, writable or
mapped read-only, converts to the signature's read-only type, so no call
compiles another version. The per-form functions are written out, each
calling its own expander: numba caches neither a function made by a
factory nor one that calls a function handed to it, and a single product
dispatching on the form kept
LLVM from fusing the expansion with the dot product into one pass
(measured, 1 row: int8 0.21 ns a weight that way, 0.17 per form; Q8_0 0.27
against 0.23).

float32 weights (the fp32 residency's small-batch call) need no expansion:
their rows are multiplied in place. On x86-64 with AVX-512 (Intel's), from four
activation rows up, by a few instructions of assembly (3x8 and 3x4 blocks, and a
6x4 one from 12 rows, :func:`product_f32_avx512`; with AVX2 a 3x4 block, :func:`product_f32_avx2`;
on AMD's Zen with AVX-512 (Zen 4, Zen 5) that block, and a 6x4 zmm block from
12 rows, :func:`product_f32_avx2_avx512`; chosen once by _kernels.dispatch.f32_assembly), since LLVM's
compiled 3x8 loop spilled its registers; elsewhere by the compiled loops.
bf16 and int8 rows from four activation rows up take the AVX2 3x4 block
too on any of those CPUs, each weight vector widened in its register
(:func:`product_bf16_avx2`, :func:`product_int8_avx2`): no buffer, a half
or a quarter of the bytes.

The functions release the GIL (``nogil``): the product threads of
kestrel_trio._model.products.matmul run them on separate cores, each on its own
stretch of rows.

Row expanders: each ``row_<form>(row, scales, f16, run, buf)`` writes one
row of a packed matrix into ``buf`` (float32 [cols]) with the same float32
operations, in the same order, as the numpy expansion
(kestrel_trio._model.forms.dequant, kestrel_trio._model.forms.packed), so the weights
equal ggml's and ``gguf``'s bit for bit. That is why they are compiled
without fastmath: a contracted ``d * q + m`` (one fused multiply-add) would
round differently. They share one signature:

* ``row``: the row's storage, contiguous (so that LLVM sees unit strides and
  vectorizes): int8 (int8), uint16 bits (bf16, F16, BF16), float32 (F32) or
  the ggml blocks' bytes, uint8.
* ``scales``: the row's scales: int8's float32 [1], int4's float16 bits
  [groups], else empty (unused).
* ``f16``: float32 [65536], every float16 bit pattern's value (numba has no
  float16 type; a table lookup is exact).
* ``run``: 32, the length of a block's inner loops, passed at run time: with
  a constant trip count LLVM unrolls those loops into scalar code before it
  can vectorize them (measured on Q8_0: 0.33 ns a weight unrolled, 0.17
  vectorized).
* ``buf``: float32 [cols], the row's weights out.

ggml block layouts are described in kestrel_trio._model.forms.dequant.

The expanders live in this file with the products on purpose: numba
invalidates a cached function when its own file changes, not when a
function it calls changes in another file. That is why this file is long:
the portable products, their expanders and dot loops are one call graph
(about 950 lines), kept whole so that an edit anywhere in it recompiles
every cached product. The x86-64 assembly blocks are
kestrel_trio._kernels.x86.float32.blocks; which kernel runs on a CPU,
kestrel_trio._kernels.plan; the dispatch, kestrel_trio._kernels.dispatch.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["FORMS", "f16_table", "COLUMNS_PER_ITEM"]  # the dispatch over these loops: kestrel_trio._kernels.dispatch


def f16_table() -> np.ndarray:
    """Every float16 bit pattern's float32 value: float32 [65536], the same bits on every architecture.

    Made from the bits, not by numpy's float16 cast: on aarch64 that cast is the CPU's ``fcvt``, which
    quiets a signalling NaN and raises the invalid flag (numpy warns), while x86-64's keeps the payload. Here
    every NaN keeps its payload and sign, as x86-64's cast gives, and no floating-point flag is raised.
    """
    bits = np.arange(1 << 16, dtype=np.uint32)  # [65536]
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    # Finite values: mantissa * 2^-24 (subnormal, exponent 0) or (1024 + mantissa) * 2^(exponent - 25), exact.
    significand = (mantissa | np.where(exponent > 0, 0x400, 0)).astype(np.float32)  # [65536]
    magnitude = np.ldexp(significand, np.maximum(exponent, 1).astype(np.int32) - 25).view(np.uint32)  # [65536]
    infinite_or_nan = np.uint32(0x7F800000) | (mantissa << 13)  # [65536]
    value = np.where(exponent == 0x1F, infinite_or_nan, magnitude) | ((bits & 0x8000) << 16)  # [65536]
    return value.astype(np.uint32).view(np.float32)


def _storage(dtype) -> types.Array:
    return types.Array(dtype, 2, "C", readonly=True)  # [rows, row_items]


_TABLE = types.Array(types.float32, 1, "C", readonly=True)  # [65536] float16 values
_ACTIVATIONS = types.Array(types.float32, 2, "C")  # x [N, cols]
_RESULT = types.Array(types.float32, 2, "A")  # out [N, rows]: a column range of a larger result
_NO_SCALES = _storage(types.uint8)  # [rows, 0]


def _signature(storage, scales=_NO_SCALES):
    """(data, scales, f16, run, x, start, stop, out) -> None, for storage of dtype ``storage`` and these scales."""
    return types.void(_storage(storage), scales, _TABLE, types.int64, _ACTIVATIONS, types.int64, types.int64, _RESULT)


def _expand_signature(storage, scales=_NO_SCALES):
    """(data, scales, f16, run, start, stop, out) -> None: ``out`` float32 [stop-start, cols], C-contiguous."""
    return types.void(_storage(storage), scales, _TABLE, types.int64, types.int64, types.int64,
                      types.Array(types.float32, 2, "C"))


_FLOATS = _storage(types.float32)
_COMPILE = dict(cache=True, nogil=True)


# ---------------------------------------------------------------- row expanders (exact)

_EXACT = dict(nogil=True, fastmath=False)


@njit(**_EXACT)
def _half(row, at, f16):
    """The little-endian float16 at byte ``at``, as float32."""
    return f16[np.int32(row[at]) | (np.int32(row[at + 1]) << 8)]


@intrinsic
def _bits_as_float32(typingctx, bits):
    """The float32 whose bits are ``bits`` (uint32): a register reinterpreted, no conversion."""
    def codegen(context, builder, signature, args):
        from llvmlite import ir

        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


# One weight's value from its stored bits, for the expanders and the one-pass products alike (one place a form's
# decoding is written). int32 arithmetic: in 64-bit lanes LLVM vectorized int4's at a third of the speed.


@njit(**_EXACT)
def _bf16_value(bits):
    """The float32 a bf16's bits hold: its top half, exactly."""
    return _bits_as_float32(np.uint32(bits) << np.uint32(16))


@njit(**_EXACT)
def _int4_low(byte):
    """The 4-bit two's complement value in the low nibble of ``byte`` (int32)."""
    return (byte & np.int32(15)) - np.int32(16) * ((byte >> np.int32(3)) & np.int32(1))


@njit(**_EXACT)
def _int4_high(byte):
    """The 4-bit two's complement value in the high nibble of ``byte`` (int32, 0-255)."""
    return (byte >> np.int32(4)) - np.int32(16) * (byte >> np.int32(7))


@njit(**_EXACT)
def _q8_signed(byte):
    """The int8 a stored byte holds, in an int32 lane: (b ^ 128) - 128 (an int8 view vectorized worse)."""
    return (np.int32(byte) ^ np.int32(128)) - np.int32(128)


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


@njit(**_EXACT)
def row_q8_0(row, scales, f16, run, buf):  # blocks of 34 bytes: fp16 d, 32 int8 q
    for block in range(buf.size // 32):
        at = 34 * block
        d = _half(row, at, f16)
        for i in range(run):
            buf[32 * block + i] = np.float32(_q8_signed(row[at + 2 + i])) * d


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
def _word(row, at):
    """The little-endian uint32 at byte ``at``, as int64."""
    return (np.int64(row[at]) | (np.int64(row[at + 1]) << 8) | (np.int64(row[at + 2]) << 16)
            | (np.int64(row[at + 3]) << 24))


@njit(**_EXACT)
def row_q5_0(row, scales, f16, run, buf):  # blocks of 22 bytes: fp16 d, uint32 of fifth bits, 16 of nibbles
    for block in range(buf.size // 32):
        at = 22 * block
        d = _half(row, at, f16)
        fifth = _word(row, at + 2)  # bit j: weight j's fifth bit
        for i in range(run // 2):
            byte = np.int64(row[at + 6 + i])
            buf[32 * block + i] = np.float32(((byte & 15) | (((fifth >> i) & 1) << 4)) - 16) * d  # d * (q - 16)
            buf[32 * block + 16 + i] = np.float32(((byte >> 4) | (((fifth >> (i + 16)) & 1) << 4)) - 16) * d


@njit(**_EXACT)
def row_q5_1(row, scales, f16, run, buf):  # blocks of 24 bytes: fp16 d, fp16 m, uint32 of fifth bits, nibbles
    for block in range(buf.size // 32):
        at = 24 * block
        d = _half(row, at, f16)
        m = _half(row, at + 2, f16)
        fifth = _word(row, at + 4)
        for i in range(run // 2):
            byte = np.int64(row[at + 8 + i])
            buf[32 * block + i] = np.float32((byte & 15) | (((fifth >> i) & 1) << 4)) * d + m  # d * q + m
            buf[32 * block + 16 + i] = np.float32((byte >> 4) | (((fifth >> (i + 16)) & 1) << 4)) * d + m


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


# ---------------------------------------------------------------- dot products (fastmath)


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


# One pass over a packed row for one to three activation rows (the products of bf16, int8, int4, Q8_0, Q4_0,
# Q4_1 and Q4_K): each weight is expanded in a register and multiplied at once. Expanding a row into a buffer and then
# taking the buffer's dot product (the other forms' way below four rows) stores and reloads every weight, which
# bounded those products by the core rather than by memory. The weight each multiplies is the expander's
# (bf16's bits shifted; int8's q * scale; Q4_1's and Q4_K's d * q + m), up to a fused multiply-add; Q8_0 and
# Q4_0 multiply a block's sum of q * x by d once. fastmath reorders the sums, as in _dot_rows. Measured, one
# thread, a row at a time, 6144 x 1024 weights from memory (2-core Zen 4), G weights/s: bf16 9.1-11.2 against
# 5.3-5.4, int8 22.2-22.4 against 9.5-9.6, Q8_0 11.3 against 7.5, Q4_1 6.4 against 5.1, Q4_K 6.3 against 4.8,
# int4 (groups of 128) 5.0-6.1 against 4.2-4.7.
# The block forms are bound by reducing each block's vector sum, not by memory.


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
                at = 34 * block
                qs = row[at + 2 : at + 34]  # slices indexed by range(run): no negative-index wraparound per weight
                xs = xb[32 * block : 32 * block + 32]
                acc = np.float32(0.0)
                for i in range(run):
                    acc += np.float32(_q8_signed(qs[i])) * xs[i]
                total += _half(row, at, f16) * acc
            out[b, r - start] = total


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
                at = 18 * block
                qs = row[at + 2 : at + 18]
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
                at = 20 * block
                d, m = _half(row, at, f16), _half(row, at + 2, f16)
                qs = row[at + 4 : at + 20]
                low, high = xb[32 * block : 32 * block + 16], xb[32 * block + 16 : 32 * block + 32]
                acc = np.float32(0.0)
                for i in range(half):
                    byte = np.int32(qs[i])
                    acc += (np.float32(byte & 15) * d + m) * low[i] + (np.float32(byte >> 4) * d + m) * high[i]
                total += acc
            out[b, r - start] = total


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
                at = 144 * block
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


# ---------------------------------------------------------------- the products, one per form
# Each: out [N, stop-start] = x [N, cols] @ W[start:stop].T: weight rows expanded into L1 buffers, four at a
# time from four activation rows up (:func:`_dot_block`), else one at a time (bf16, int8, int4, Q8_0, Q4_0, Q4_1
# and Q4_K: in one pass, no buffer, :func:`_one_pass_bf16`). Written out: numba caches neither a function made by a
# factory nor one that calls an expander handed to it (a "dynamic global").


def product_int8(data, scales, f16, run, x, start, stop, out):
    _int8_rows(data, scales, f16, run, x, start, stop, out)


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


def product_int4(data, scales, f16, run, x, start, stop, out):
    if x.shape[0] < 4:
        if (x.shape[1] // 2) % (x.shape[1] // scales.shape[1]) == 0:  # each half whole groups
            _one_pass_int4(data, scales, f16, x, start, stop, out)
            return
        buf = np.empty(x.shape[1], np.float32)  # [cols]; groups straddling the halves: row_int4 weight by weight
        for r in range(start, stop):
            row_int4(data[r], scales[r], f16, run, buf)
            _dot_rows(buf, x, out, r - start, 0)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_int4(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)


def product_bf16(data, scales, f16, run, x, start, stop, out):
    _bf16_rows(data, scales, f16, run, x, start, stop, out)


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


def product_f32(data, scales, f16, run, x, start, stop, out):
    # already float32: the rows themselves are the buffers
    first = start
    if x.shape[0] >= 8:
        while first + 3 <= stop:
            _dot_block_3x8(data[first : first + 3], x, out, first - start)
            first += 3
    _f32_rest(data, x, first, start, stop, out)


def product_f16(data, scales, f16, run, x, start, stop, out):
    if x.shape[0] < 4:
        buf = np.empty(x.shape[1], np.float32)  # [cols]
        for r in range(start, stop):
            row_f16(data[r], scales[r], f16, run, buf)
            _dot_rows(buf, x, out, r - start, 0)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_f16(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)


def product_q8_0(data, scales, f16, run, x, start, stop, out):
    if x.shape[0] < 4:
        _one_pass_q8_0(data, f16, run, x, start, stop, out)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_q8_0(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)


def product_q4_0(data, scales, f16, run, x, start, stop, out):
    if x.shape[0] < 4:
        _one_pass_q4_0(data, f16, run, x, start, stop, out)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_q4_0(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)


def product_q4_1(data, scales, f16, run, x, start, stop, out):
    if x.shape[0] < 4:
        _one_pass_q4_1(data, f16, run, x, start, stop, out)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_q4_1(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)


def product_q5_0(data, scales, f16, run, x, start, stop, out):
    if x.shape[0] < 4:
        buf = np.empty(x.shape[1], np.float32)  # [cols]
        for r in range(start, stop):
            row_q5_0(data[r], scales[r], f16, run, buf)
            _dot_rows(buf, x, out, r - start, 0)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_q5_0(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)


def product_q5_1(data, scales, f16, run, x, start, stop, out):
    if x.shape[0] < 4:
        buf = np.empty(x.shape[1], np.float32)  # [cols]
        for r in range(start, stop):
            row_q5_1(data[r], scales[r], f16, run, buf)
            _dot_rows(buf, x, out, r - start, 0)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_q5_1(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)


def product_q4_k(data, scales, f16, run, x, start, stop, out):
    if x.shape[0] < 4:
        _one_pass_q4_k(data, f16, run, x, start, stop, out)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_q4_k(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)


def product_q5_k(data, scales, f16, run, x, start, stop, out):
    if x.shape[0] < 4:
        buf = np.empty(x.shape[1], np.float32)  # [cols]
        for r in range(start, stop):
            row_q5_k(data[r], scales[r], f16, run, buf)
            _dot_rows(buf, x, out, r - start, 0)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_q5_k(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)


def product_q6_k(data, scales, f16, run, x, start, stop, out):
    if x.shape[0] < 4:
        buf = np.empty(x.shape[1], np.float32)  # [cols]
        for r in range(start, stop):
            row_q6_k(data[r], scales[r], f16, run, buf)
            _dot_rows(buf, x, out, r - start, 0)
        return
    bufs = np.empty((4, x.shape[1]), np.float32)  # [4, cols]
    for first in range(start, stop, 4):
        for r in range(first, min(first + 4, stop)):
            row_q6_k(data[r], scales[r], f16, run, bufs[r - first])
        _multiply(bufs, min(4, stop - first), x, out, first - start)


# ---------------------------------------------------------------- the expansions, one per form
# Each: out [stop-start, cols] = W[start:stop] as float32, exactly (a prefill's chunks, multiplied by BLAS).


def expand_int8(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_int8(data[r], scales[r], f16, run, out[r - start])


def expand_int4(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_int4(data[r], scales[r], f16, run, out[r - start])


def expand_bf16(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_bf16(data[r], scales[r], f16, run, out[r - start])


def expand_f32(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_f32(data[r], scales[r], f16, run, out[r - start])


def expand_f16(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_f16(data[r], scales[r], f16, run, out[r - start])


def expand_q8_0(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_q8_0(data[r], scales[r], f16, run, out[r - start])


def expand_q4_0(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_q4_0(data[r], scales[r], f16, run, out[r - start])


def expand_q4_1(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_q4_1(data[r], scales[r], f16, run, out[r - start])


def expand_q5_0(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_q5_0(data[r], scales[r], f16, run, out[r - start])


def expand_q5_1(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_q5_1(data[r], scales[r], f16, run, out[r - start])


def expand_q4_k(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_q4_k(data[r], scales[r], f16, run, out[r - start])


def expand_q5_k(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_q5_k(data[r], scales[r], f16, run, out[r - start])


def expand_q6_k(data, scales, f16, run, start, stop, out):
    for r in range(start, stop):
        row_q6_k(data[r], scales[r], f16, run, out[r - start])


# Weights per item of each form's storage as its product takes it (34 bytes of Q8_0 hold 32).
COLUMNS_PER_ITEM = {
    "int8": 1, "int4": 2, "bf16": 1, "F32": 1, "F16": 1, "BF16": 1, "Q8_0": 32 / 34, "Q4_0": 32 / 18, "Q4_1": 32 / 20,
    "Q5_0": 32 / 22, "Q5_1": 32 / 24, "Q4_K": 256 / 144, "Q5_K": 256 / 176, "Q6_K": 256 / 210,
}
# Storage form -> its product and expansion (as Python), the dtype of its storage in their signatures, the
# scales' type, and how the storage is viewed for them (None: as stored).
_PRODUCTS = {
    "int8": (product_int8, expand_int8, types.int8, _FLOATS, None),
    "int4": (product_int4, expand_int4, types.uint8, _storage(types.uint16), None),
    "bf16": (product_bf16, expand_bf16, types.uint16, _NO_SCALES, None),
    "F32": (product_f32, expand_f32, types.float32, _NO_SCALES, np.float32),
    "F16": (product_f16, expand_f16, types.uint16, _NO_SCALES, np.uint16),
    "BF16": (product_bf16, expand_bf16, types.uint16, _NO_SCALES, np.uint16),
    **{name: (product, expand, types.uint8, _NO_SCALES, None) for name, product, expand in (
        ("Q8_0", product_q8_0, expand_q8_0), ("Q4_0", product_q4_0, expand_q4_0), ("Q4_1", product_q4_1, expand_q4_1),
        ("Q5_0", product_q5_0, expand_q5_0), ("Q5_1", product_q5_1, expand_q5_1), ("Q4_K", product_q4_k, expand_q4_k),
        ("Q5_K", product_q5_k, expand_q5_k), ("Q6_K", product_q6_k, expand_q6_k))},
}
FORMS = frozenset(_PRODUCTS)
