"""GGUF-quantized x int8 block dot products for aarch64 NEON: ``sdot`` with dotprod, widening without.

Theory of operation: each block's product is ``d_w * d_x * (the int8
products of its 32 weights and 32 quantized activations)`` (Q4_1 adds its
minimum times the block's activation sum, ``m_w * s_x``; a Q4_K block of 256
is eight sub-blocks of 32, each with its scale ``d * scale`` and offset ``min
* -dmin`` from ggml's 6-bit packing). The portable
reference (``_kernels.portable.integer.product_blocks``) fixes the arithmetic; this file
emits it as LLVM vector IR (numba ``intrinsic``s), since numba's loops over a
fixed 32-block unroll into scalar code. A block, for one weight row:

- its 32 weights as two int8x16 vectors: Q8_0's bytes as stored; Q4_0's 16
  bytes of nibbles split (low nibbles: weights 0-15, high: 16-31), unsigned,
  their 8 taken off once for the four rows (the lanes start at ``-8 * x``'s);
  Q4_1's split, unsigned; Q4_K's sub-block pair's 32 bytes, low nibbles for the
  even sub-block, high for the odd; Q5_0 and Q5_1 as Q4_0 and Q4_1 with the
  fifth bits of their uint32 spread a byte to 8 lanes and tested lane by lane
  (``cmtst``), Q5_0's 16 taken off as Q4_0's 8; Q5_K as Q4_K with sub-block
  ``j``'s fifth bits shifted from bit ``j`` of its 32 bytes to bit 4; Q6_K's
  nibbles or'ed with its 2-bit parts shifted to bits 4-5, less 32;
- its 32 products summed into four int32 lanes, lane ``j`` holding bytes
  ``4j..4j+3`` and ``16+4j..16+4j+3``: two ``sdot`` (``llvm.aarch64.neon.sdot``;
  ARMv8.2-A dotprod: Cortex-A76, A55), or without dotprod the same lane sums from
  sign-extended bytes (generic IR that LLVM lowers to ``smull``/``sadalp`` on
  NEON, to ``vpmaddwd`` on x86-64);
- Q6_K: one ``sdot`` a 16 weights, its lanes times the 16 weights' int8 scale
  (``mul``), the two added (exact in int32, and below 2**24);
- the four rows' lanes reduced to one int32 sum a row in one int32x4 vector
  (three ``addp``), converted to float32 at once (one ``scvtf``); the rows'
  float16 scales gathered into one vector and converted at once (``fcvtl``),
  times ``d_x`` (one ``fmul``), and accumulated as ``acc = fma(sums, d_w * d_x,
  acc)`` (one ``fmla``): one float32 a row, lane i row i's;
- Q4_1, Q5_1, Q4_K, Q5_K: ``bias = fma(offset, s_x, bias)``, a float32 scalar a row;
- at the row's end its lane of ``acc`` (``+ bias``).

Rows go four at a time (Q8_0 and Q4_0 with sdot eight), sharing the activation
loads, the loop and the block's float32 steps (a row left over goes alone, its
sum by the same adds). Integer sums are exact, and every float32 step is the
reference's in its order, so each variant equals the reference bit for bit. A
weight's float16 scale is converted by the CPU (``fcvt``, ``fcvtl``), which
equals the reference's table on every finite and infinite value.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from kestrel_trio._kernels.portable import handoff

__all__ = ["FORMS", "product_sdot", "product_widening", "form_id", "job_entry"]

_I8x16 = ir.VectorType(ir.IntType(8), 16)
_I32x4 = ir.VectorType(ir.IntType(32), 4)
_I32x16 = ir.VectorType(ir.IntType(32), 16)
_F32 = ir.FloatType()
_I64 = ir.IntType(64)
_ROWS = 4  # weight rows a pass
_ROWS_WIDE = 8  # Q8_0's and Q4_0's with sdot


def _lanes_sdot(builder, pairs, init=None):
    """``init`` (int32x4, default zeros) + the int32 lane sums of ``pairs`` (int8x16 weights, int8x16
    activations; one or two) by one ``sdot`` each."""
    sdot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32x4, [_I32x4, _I8x16, _I8x16]),
                                          "llvm.aarch64.neon.sdot.v4i32.v16i8")
    lanes = ir.Constant(_I32x4, None) if init is None else init
    for w, x in pairs:
        lanes = builder.call(sdot, [lanes, w, x])  # [4] int32
    return lanes


def _lanes_widening(builder, pairs, init=None):
    """The same lane sums without dotprod: bytes sign-extended, multiplied, each lane's four added."""
    products = None
    for w, x in pairs:
        product = builder.mul(builder.sext(w, _I32x16), builder.sext(x, _I32x16))  # [16] int32
        products = product if products is None else builder.add(products, product)
    parts = [builder.shuffle_vector(products, products, ir.Constant(_I32x4, [i, 4 + i, 8 + i, 12 + i]))
             for i in range(4)]  # [4] int32 each: the i-th byte of every lane's group
    lanes = builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))  # [4] int32
    return lanes if init is None else builder.add(init, lanes)


def _load16(builder, base, offset):
    """16 bytes at ``base + offset`` (bytes) as an int8x16 vector, any alignment."""
    return builder.load(builder.bitcast(builder.gep(base, [offset]), _I8x16.as_pointer()), align=1)


# Each form: (bytes a block, where its quants start, whether it has minimums, 32-weight sub-blocks a block).
FORMS = {"Q8_0": (34, 2, False, 1), "Q4_0": (18, 2, False, 1), "Q4_1": (20, 4, True, 1), "Q4_K": (144, 16, True, 8),
         "Q5_0": (22, 6, False, 1), "Q5_1": (24, 8, True, 1), "Q5_K": (176, 48, True, 8), "Q6_K": (210, 0, False, 8)}
# the kernels' ``form`` argument
_FORM_IDS = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2, "Q4_K": 3, "Q5_0": 4, "Q5_1": 5, "Q5_K": 6, "Q6_K": 7}
# Forms whose weights _sub_blocks gives as stored, unsigned: each weight is that less this. A block's products
# are then sum(stored * x) - lift * sum(x): the second part, shared by the four rows, starts each row's lanes
# (where a zero would), so the weights need no subtraction a row (exact: integers).
_LIFTS = {"Q4_0": 8, "Q5_0": 16}


def _sub_blocks(builder, form: str, at):
    """The block at ``at`` as its 32-weight sub-blocks: for each, its weights as two int8x16 vectors (weights
    0-15, 16-31), its float32 scale, its float32 offset (Q4_1's and Q5_1's minimum ``m``; Q4_K's and Q5_K's ``min
    * -dmin``) or None, and Q6_K's int8 scales of weights 0-15 and 16-31 as int32 or None."""
    quants = FORMS[form][1]
    if form == "Q8_0":
        return [(_load16(builder, at, _at(quants)), _load16(builder, at, _at(quants + 16)),
                 _half_at(builder, at, 0, raw=True), None, None)]
    if form in ("Q4_K", "Q5_K"):  # 8 sub-blocks: pair p's 32 bytes hold sub-block 2p in low nibbles, 2p + 1 in high
        d, minus_dmin = _half_at(builder, at, 0), builder.fneg(_half_at(builder, at, 2))
        fifths = (_load16(builder, at, _at(16)), _load16(builder, at, _at(32))) if form == "Q5_K" else None
        found = []
        for pair in range(4):
            bytes0 = _load16(builder, at, _at(quants + 32 * pair))  # weights 0-15 of both sub-blocks
            bytes1 = _load16(builder, at, _at(quants + 32 * pair + 16))  # weights 16-31
            for high in (False, True):
                scale, low_min = _k_scale_min(builder, at, 2 * pair + high)
                weights = [_nibbles(builder, v, high) for v in (bytes0, bytes1)]
                if fifths is not None:  # bit j of fifth-bit byte i: weight i of sub-block j, moved to bit 4
                    weights = [builder.or_(w, _bit_to(builder, f, 2 * pair + high, 4)) for w, f in zip(weights, fifths)]
                found.append((*weights, builder.fmul(d, builder.uitofp(scale, _F32)),
                              builder.fmul(builder.uitofp(low_min, _F32), minus_dmin), None))
        return found
    if form == "Q6_K":
        return _q6_k_sub_blocks(builder, at)
    nibbles = _load16(builder, at, _at(quants))  # [16] bytes: weight i low, weight 16 + i high
    low, high = _nibbles(builder, nibbles, False), _nibbles(builder, nibbles, True)
    if form in ("Q5_0", "Q5_1"):
        low, high = _fifth_bits(builder, at, quants - 4, low, high)
    offset = _half_at(builder, at, 2) if FORMS[form][2] else None  # Q4_1's, Q5_1's m
    return [(low, high, _half_at(builder, at, 0, raw=True), offset, None)]


def _fifth_bits(builder, at, offset: int, low, high):
    """Q5_0's and Q5_1's weights as stored (0-31; Q5_0's less 16: _LIFTS) from their nibbles ``low`` (weights
    0-15), ``high`` (16-31) and the uint32 of fifth bits at ``at + offset`` (bit i: weight i's): each of its
    bytes spread over 8 lanes, its bits tested lane by lane (``cmtst``)."""
    word = builder.load(builder.bitcast(builder.gep(at, [_at(offset)]), ir.VectorType(ir.IntType(8), 4)
                                        .as_pointer()), align=1)  # [4] bytes: weights 0-7, 8-15, 16-23, 24-31
    bits = ir.Constant(_I8x16, [1 << (i % 8) for i in range(16)])
    zero = ir.Constant(_I8x16, None)
    found = []
    for nibbles, first in ((low, 0), (high, 2)):
        spread = builder.shuffle_vector(word, word, ir.Constant(_I32x16, [first + i // 8 for i in range(16)]))
        clear = builder.icmp_unsigned("==", builder.and_(spread, bits), zero)  # [16] bool: the fifth bit is 0
        found.append(builder.or_(nibbles, builder.select(clear, zero, ir.Constant(_I8x16, [16] * 16))))
    return found


def _bit_to(builder, vector, bit: int, to: int):
    """Bit ``bit`` of each byte of an int8x16 vector moved to bit ``to``, the others cleared: one shift, one and."""
    if bit < to:
        vector = builder.shl(vector, ir.Constant(_I8x16, [to - bit] * 16))
    elif bit > to:
        vector = builder.lshr(vector, ir.Constant(_I8x16, [bit - to] * 16))
    return builder.and_(vector, ir.Constant(_I8x16, [1 << to] * 16))


def _q6_k_sub_blocks(builder, at):
    """Q6_K's 8 sub-blocks of 32: in each half of 128 weights (64 bytes of nibbles, 32 of 2-bit high parts at
    128), quarter q the low (q < 2) or high nibbles of the half's first (q even) or second 32 bytes, or'ed with
    bits 2q, 2q + 1 of the high bytes moved to bits 4-5, less 32; its two int8 scales (bytes 192 + 2k, 193 + 2k
    of sub-block k); the float16 d at 208 its float scale."""
    d = _half_at(builder, at, 208, raw=True)
    thirty_two, mask = ir.Constant(_I8x16, [32] * 16), ir.Constant(_I8x16, [0x30] * 16)
    found = []
    for half in range(2):
        lows = [_load16(builder, at, _at(64 * half + 16 * i)) for i in range(4)]  # [16] bytes each
        highs = [_load16(builder, at, _at(128 + 32 * half + 16 * i)) for i in range(2)]  # [16] bytes each
        for quarter in range(4):
            weights = []
            for i in range(2):
                nibbles = _nibbles(builder, lows[2 * (quarter % 2) + i], quarter >= 2)
                twos = highs[i]
                if quarter < 2:
                    twos = builder.shl(twos, ir.Constant(_I8x16, [4 - 2 * quarter] * 16))
                elif quarter == 3:
                    twos = builder.lshr(twos, ir.Constant(_I8x16, [2] * 16))
                weights.append(builder.sub(builder.or_(nibbles, builder.and_(twos, mask)), thirty_two))
            k = 4 * half + quarter
            scales = tuple(builder.sext(builder.load(builder.gep(at, [_at(192 + 2 * k + i)])), ir.IntType(32))
                           for i in range(2))
            found.append((*weights, d, None, scales))
    return found


def _at(offset: int):
    return ir.Constant(_I64, offset)


def _nibbles(builder, vector, high: bool):
    """The low or high nibbles of an int8x16 vector's bytes, 0-15."""
    if high:
        return builder.lshr(vector, ir.Constant(_I8x16, [4] * 16))
    return builder.and_(vector, ir.Constant(_I8x16, [0x0F] * 16))


def _k_scale_min(builder, at, j: int):
    """Q4_K sub-block ``j``'s 6-bit scale and minimum (int32), from the 12 bytes at ``at + 4`` (ggml's packing)."""
    def byte(i):
        return builder.zext(builder.load(builder.gep(at, [_at(4 + i)])), ir.IntType(32))

    def const(v):
        return ir.Constant(ir.IntType(32), v)

    if j < 4:
        return builder.and_(byte(j), const(63)), builder.and_(byte(j + 4), const(63))
    packed = byte(j + 4)
    scale = builder.or_(builder.and_(packed, const(15)), builder.shl(builder.lshr(byte(j - 4), const(6)), const(4)))
    low_min = builder.or_(builder.lshr(packed, const(4)), builder.shl(builder.lshr(byte(j), const(6)), const(4)))
    return scale, low_min


def _row_sums(builder, lanes):
    """The rows' int32 sums of their lanes (int32x4 each; one, four or eight rows) as one int32 vector [rows]:
    four rows by three pairwise adds (``addp``), eight as two fours, lane i row i's sum (exact: integers)."""
    def pairwise(a, b):  # [a0 + a1, a2 + a3, b0 + b1, b2 + b3]
        return builder.add(builder.shuffle_vector(a, b, ir.Constant(_I32x4, [0, 2, 4, 6])),
                           builder.shuffle_vector(a, b, ir.Constant(_I32x4, [1, 3, 5, 7])))

    if len(lanes) == 8:  # two groups of four, end to end
        first, second = _row_sums(builder, lanes[:4]), _row_sums(builder, lanes[4:])
        return builder.shuffle_vector(first, second, ir.Constant(ir.VectorType(ir.IntType(32), 8), list(range(8))))
    if len(lanes) == 4:
        return pairwise(pairwise(lanes[0], lanes[1]), pairwise(lanes[2], lanes[3]))  # [4] int32
    assert len(lanes) == 1
    once = pairwise(lanes[0], lanes[0])  # [s01, s23, s01, s23]
    twice = pairwise(once, once)  # [s, s, s, s]
    return builder.shuffle_vector(twice, twice, ir.Constant(ir.VectorType(ir.IntType(32), 1), [0]))  # [1] int32


def _splat_i32(builder, value):
    """An int32 in all four lanes of an int32x4 vector."""
    one = builder.insert_element(ir.Constant(_I32x4, None), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(_I32x4, None), ir.Constant(_I32x4, [0] * 4))


def _half_at(builder, at, offset: int, raw: bool = False):
    """The float16 at ``at + offset`` (bytes), as float32 (``raw``: as float16, for :func:`_steps` to convert)."""
    pointer = builder.bitcast(builder.gep(at, [ir.Constant(_I64, offset)]), ir.HalfType().as_pointer())
    value = builder.load(pointer, align=1)
    return value if raw else builder.fpext(value, _F32)


def _steps(builder, scales, d_x):
    """The rows' ``scale_w * d_x`` as one float32 vector [len(scales)]: the weights' scales (float16 as stored,
    or float32 where computed: Q4_K's, Q5_K's ``d * scale``) gathered into one vector, float16 ones converted
    together (one ``fcvtl``), and multiplied by the activations' float32 ``d_x`` at once (one ``fmul``); each
    lane is the reference's scalar ``scale_w * d_x``, rounded as it."""
    kind = scales[0].type
    vector = ir.Constant(ir.VectorType(kind, len(scales)), None)
    for i, value in enumerate(scales):
        vector = builder.insert_element(vector, value, ir.Constant(ir.IntType(32), i))
    n = len(scales)
    floats, indices = ir.VectorType(_F32, n), ir.VectorType(ir.IntType(32), n)
    if isinstance(kind, ir.HalfType):
        vector = builder.fpext(vector, floats)  # [rows] float32, exact
    one = builder.insert_element(ir.Constant(floats, None), d_x, ir.Constant(ir.IntType(32), 0))
    splat = builder.shuffle_vector(one, ir.Constant(floats, None), ir.Constant(indices, [0] * n))  # [rows] d_x
    return builder.fmul(vector, splat)  # [rows] float32


def _rows_dot(lanes_of, rows: int, form: str):
    """An intrinsic ``(data, r, xq, xd, xs, out, b, column) -> None``: ``form`` rows ``data[r : r + rows]``
    (uint8 [rows, blocks * block bytes], C order) against quantized activation row ``b`` (``xq`` int8 [N, blocks
    * 32], ``xd`` float32 [N, blocks]; ``xs`` float32 [N, blocks], the blocks' sums ``d_x * sum(q_x)``, read for
    the forms with minimums only), into ``out[b, column : column + rows]``."""
    block_bytes, _, has_min, subs = FORMS[form]

    @intrinsic
    def rows_dot(typingctx, data, r, xq, xd, xs, out, b, column):
        def codegen(context, builder, signature, args):
            data_t, _, xq_t, xd_t, xs_t, out_t, _, _ = signature.args
            data_a = context.make_array(data_t)(context, builder, args[0])
            xq_a = context.make_array(xq_t)(context, builder, args[2])
            xd_a = context.make_array(xd_t)(context, builder, args[3])
            xs_a = context.make_array(xs_t)(context, builder, args[4])
            out_a = context.make_array(out_t)(context, builder, args[5])
            r, b, column = (context.cast(builder, v, t, types.intp) for v, t in
                            ((args[1], signature.args[1]), (args[6], signature.args[6]), (args[7], signature.args[7])))
            zero = ir.Constant(_I64, 0)
            row_ptrs = [cgutils.get_item_pointer2(context, builder, data_a.data, cgutils.unpack_tuple(
                builder, data_a.shape, 2), cgutils.unpack_tuple(builder, data_a.strides, 2), "C",
                [builder.add(r, ir.Constant(_I64, i)), zero]) for i in range(rows)]  # uint8* each
            x_ptr = cgutils.get_item_pointer(context, builder, xq_t, xq_a, [b, zero])  # int8*
            d_ptr = cgutils.get_item_pointer(context, builder, xd_t, xd_a, [b, zero])  # float*
            s_ptr = cgutils.get_item_pointer(context, builder, xs_t, xs_a, [b, zero])  # float*
            units = builder.sdiv(builder.extract_value(xq_a.shape, 1), ir.Constant(_I64, 32 * subs))  # blocks
            floats = ir.VectorType(_F32, rows)  # one float32 a row
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(floats, [floats] * 3),
                                                 f"llvm.fma.v{rows}f32")
            acc = cgutils.alloca_once_value(builder, ir.Constant(floats, None))  # [rows] float32
            biases = [cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in range(rows)]
            fma1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3), "llvm.fma.f32")
            with cgutils.for_range(builder, units) as loop:
                first = builder.mul(loop.index, _at(subs))  # the block's first 32-weight sub-block
                activations = []
                for sub in range(subs):
                    k = builder.add(first, _at(sub))
                    x_at = builder.gep(x_ptr, [builder.mul(k, _at(32))])
                    activations.append((_load16(builder, x_at, zero), _load16(builder, x_at, _at(16)),
                                        builder.load(builder.gep(d_ptr, [k])),
                                        builder.load(builder.gep(s_ptr, [k])) if has_min else None))
                w_off = builder.mul(loop.index, _at(block_bytes))
                found = [_sub_blocks(builder, form, builder.gep(row_ptr, [w_off])) for row_ptr in row_ptrs]
                for sub, (x0, x1, d_x, s_x) in enumerate(activations):
                    init = None  # each row's lanes start here: zeros, or the weights' lift (_LIFTS) taken off
                    if form in _LIFTS:
                        minus = ir.Constant(_I8x16, [-_LIFTS[form]] * 16)
                        init = lanes_of(builder, [(minus, x0), (minus, x1)])  # [4] int32: -lift * x's lanes
                    all_lanes = []
                    for i, bias in enumerate(biases):
                        w0, w1, _, offset_w, halves = found[i][sub]
                        if has_min:
                            builder.store(builder.call(fma1, [offset_w, s_x, builder.load(bias)]), bias)
                        if halves is None:
                            lanes = lanes_of(builder, [(w0, x0), (w1, x1)], init)  # [4] int32
                        else:  # Q6_K: each 16 weights' lane sums times their int8 scale, exact in int32
                            lanes = builder.add(*(builder.mul(lanes_of(builder, [pair]), _splat_i32(builder, s))
                                                  for pair, s in zip(((w0, x0), (w1, x1)), halves)))  # [4] int32
                        all_lanes.append(lanes)
                    sums = builder.sitofp(_row_sums(builder, all_lanes), floats)  # [rows] float32, exact (< 2**24)
                    steps = _steps(builder, [f[sub][2] for f in found], d_x)  # [rows] float32: scale_w * d_x
                    builder.store(builder.call(fma, [sums, steps, builder.load(acc)]), acc)
            totals = builder.load(acc)
            for i, bias in enumerate(biases):
                total = builder.extract_element(totals, ir.Constant(ir.IntType(32), i))
                if has_min:
                    total = builder.fadd(total, builder.load(bias))
                builder.store(total, cgutils.get_item_pointer(
                    context, builder, out_t, out_a, [b, builder.add(column, ir.Constant(_I64, i))]))
            return context.get_dummy_value()

        if not (isinstance(data, types.Array) and data.ndim == 2 and data.layout == "C" and data.dtype == types.uint8):
            return None
        if not (isinstance(xq, types.Array) and xq.ndim == 2 and xq.layout == "C" and xq.dtype == types.int8):
            return None
        for scales in (xd, xs):
            if not (isinstance(scales, types.Array) and scales.ndim == 2 and scales.layout == "C"
                    and scales.dtype == types.float32):
                return None
        if not (isinstance(out, types.Array) and out.ndim == 2 and out.dtype == types.float32):
            return None
        return types.void(data, r, xq, xd, xs, out, b, column), codegen

    return rows_dot


_KERNELS = {(lanes.__name__, form, rows): _rows_dot(lanes, rows, form)
            for lanes in (_lanes_sdot, _lanes_widening) for form in FORMS for rows in (_ROWS, 1)}
# Q8_0 and Q4_0 with sdot also eight rows a pass: the activations' loads, the loop and the block's float32 steps
# shared by twice the rows; the loop still fits NEON's 32 registers (no stack access in its assembly).
# Counted as a Cortex-A76 on one 576 x 1536 product, instructions a weight: Q8_0 0.38 four rows a pass, 0.30
# eight; Q4_0 0.43, 0.39.
_q8_0_sdot_8, _q4_0_sdot_8 = _rows_dot(_lanes_sdot, _ROWS_WIDE, "Q8_0"), _rows_dot(_lanes_sdot, _ROWS_WIDE, "Q4_0")
_q8_0_sdot, _q8_0_sdot_1 = _KERNELS["_lanes_sdot", "Q8_0", _ROWS], _KERNELS["_lanes_sdot", "Q8_0", 1]
_q4_0_sdot, _q4_0_sdot_1 = _KERNELS["_lanes_sdot", "Q4_0", _ROWS], _KERNELS["_lanes_sdot", "Q4_0", 1]
_q4_1_sdot, _q4_1_sdot_1 = _KERNELS["_lanes_sdot", "Q4_1", _ROWS], _KERNELS["_lanes_sdot", "Q4_1", 1]
_q4_k_sdot, _q4_k_sdot_1 = _KERNELS["_lanes_sdot", "Q4_K", _ROWS], _KERNELS["_lanes_sdot", "Q4_K", 1]
_q5_0_sdot, _q5_0_sdot_1 = _KERNELS["_lanes_sdot", "Q5_0", _ROWS], _KERNELS["_lanes_sdot", "Q5_0", 1]
_q5_1_sdot, _q5_1_sdot_1 = _KERNELS["_lanes_sdot", "Q5_1", _ROWS], _KERNELS["_lanes_sdot", "Q5_1", 1]
_q5_k_sdot, _q5_k_sdot_1 = _KERNELS["_lanes_sdot", "Q5_K", _ROWS], _KERNELS["_lanes_sdot", "Q5_K", 1]
_q6_k_sdot, _q6_k_sdot_1 = _KERNELS["_lanes_sdot", "Q6_K", _ROWS], _KERNELS["_lanes_sdot", "Q6_K", 1]
_q8_0_wide, _q8_0_wide_1 = _KERNELS["_lanes_widening", "Q8_0", _ROWS], _KERNELS["_lanes_widening", "Q8_0", 1]
_q4_0_wide, _q4_0_wide_1 = _KERNELS["_lanes_widening", "Q4_0", _ROWS], _KERNELS["_lanes_widening", "Q4_0", 1]
_q4_1_wide, _q4_1_wide_1 = _KERNELS["_lanes_widening", "Q4_1", _ROWS], _KERNELS["_lanes_widening", "Q4_1", 1]
_q4_k_wide, _q4_k_wide_1 = _KERNELS["_lanes_widening", "Q4_K", _ROWS], _KERNELS["_lanes_widening", "Q4_K", 1]
_q5_0_wide, _q5_0_wide_1 = _KERNELS["_lanes_widening", "Q5_0", _ROWS], _KERNELS["_lanes_widening", "Q5_0", 1]
_q5_1_wide, _q5_1_wide_1 = _KERNELS["_lanes_widening", "Q5_1", _ROWS], _KERNELS["_lanes_widening", "Q5_1", 1]
_q5_k_wide, _q5_k_wide_1 = _KERNELS["_lanes_widening", "Q5_K", _ROWS], _KERNELS["_lanes_widening", "Q5_K", 1]
_q6_k_wide, _q6_k_wide_1 = _KERNELS["_lanes_widening", "Q6_K", _ROWS], _KERNELS["_lanes_widening", "Q6_K", 1]


# One compiled function a lane kind, the form chosen by an argument (``_FORM_IDS``) outside the loops: numba
# caches neither a function a factory makes nor one handed a kernel, so the kernels are named here.
@njit(nogil=True, cache=True)
def product_sdot(form, data, xq, xd, xs, start, stop, out):
    """``out`` [N, stop-start] = the quantized activations ``xq`` int8 [N, cols] / ``xd``, ``xs`` float32 [N,
    cols/32] (scales, block sums) @ rows ``data`` uint8 [start:stop, ...] of form ``form`` (0: Q8_0, 1: Q4_0,
    2: Q4_1, 3: Q4_K, 4: Q5_0, 5: Q5_1, 6: Q5_K, 7: Q6_K), by ``sdot`` (needs dotprod), four rows a pass (Q8_0
    and Q4_0 eight, then four), the rows left one at a time."""
    r = start
    if form <= 1:  # Q8_0, Q4_0: eight rows a pass first
        while r + 8 <= stop:
            for b in range(xq.shape[0]):
                if form == 0:
                    _q8_0_sdot_8(data, r, xq, xd, xs, out, b, r - start)
                else:
                    _q4_0_sdot_8(data, r, xq, xd, xs, out, b, r - start)
            r += 8
    while r + 4 <= stop:
        for b in range(xq.shape[0]):
            if form == 0:
                _q8_0_sdot(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_sdot(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_sdot(data, r, xq, xd, xs, out, b, r - start)
            elif form == 3:
                _q4_k_sdot(data, r, xq, xd, xs, out, b, r - start)
            elif form == 4:
                _q5_0_sdot(data, r, xq, xd, xs, out, b, r - start)
            elif form == 5:
                _q5_1_sdot(data, r, xq, xd, xs, out, b, r - start)
            elif form == 6:
                _q5_k_sdot(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q6_k_sdot(data, r, xq, xd, xs, out, b, r - start)
        r += 4
    for last in range(r, stop):
        for b in range(xq.shape[0]):
            if form == 0:
                _q8_0_sdot_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 1:
                _q4_0_sdot_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 2:
                _q4_1_sdot_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 3:
                _q4_k_sdot_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 4:
                _q5_0_sdot_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 5:
                _q5_1_sdot_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 6:
                _q5_k_sdot_1(data, last, xq, xd, xs, out, b, last - start)
            else:
                _q6_k_sdot_1(data, last, xq, xd, xs, out, b, last - start)


@njit(nogil=True, cache=True)
def product_widening(form, data, xq, xd, xs, start, stop, out):
    """As :func:`product_sdot` without the dot-product extension (any NEON CPU; x86-64 too)."""
    r = start
    while r + 4 <= stop:
        for b in range(xq.shape[0]):
            if form == 0:
                _q8_0_wide(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_wide(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_wide(data, r, xq, xd, xs, out, b, r - start)
            elif form == 3:
                _q4_k_wide(data, r, xq, xd, xs, out, b, r - start)
            elif form == 4:
                _q5_0_wide(data, r, xq, xd, xs, out, b, r - start)
            elif form == 5:
                _q5_1_wide(data, r, xq, xd, xs, out, b, r - start)
            elif form == 6:
                _q5_k_wide(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q6_k_wide(data, r, xq, xd, xs, out, b, r - start)
        r += 4
    for last in range(r, stop):
        for b in range(xq.shape[0]):
            if form == 0:
                _q8_0_wide_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 1:
                _q4_0_wide_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 2:
                _q4_1_wide_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 3:
                _q4_k_wide_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 4:
                _q5_0_wide_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 5:
                _q5_1_wide_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 6:
                _q5_k_wide_1(data, last, xq, xd, xs, out, b, last - start)
            else:
                _q6_k_wide_1(data, last, xq, xd, xs, out, b, last - start)


def form_id(form: str) -> int:
    """The kernels' ``form`` argument for a form name of FORMS."""
    return _FORM_IDS[form]


# Each kernel's job entry (kestrel_trio._kernels.portable.handoff: a product's share run by another thread in compiled
# code), here beside its kernel so that an edit of either refreshes numba's cache of both.
_JOB_LAYOUT = "job-2"  # handoff's job row layout these entries were written for (handoff.entry checks it)


def _job_sdot(row):
    product_sdot(*handoff.job_arrays(row))


def _job_widening(row):
    product_widening(*handoff.job_arrays(row))


_JOBS = {"product_sdot": _job_sdot, "product_widening": _job_widening}


def job_entry(kernel: str) -> int:
    """The address of kernel ``kernel``'s (e.g. "product_sdot") job entry, compiled or loaded from numba's cache on
    first use."""
    return handoff.entry(_JOBS[kernel], _JOB_LAYOUT)
