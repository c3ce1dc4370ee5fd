"""Q8_0, Q4_0, Q4_1, Q4_K x int8 block dot products for x86-64: ``vpdpbusd`` (AVX-512 VNNI or AVX-VNNI), AVX2.

Theory of operation: the portable reference (``_kernels.integer.product_blocks``)
fixes the arithmetic: per 32-weight sub-block four int32 lane sums, lane ``j``
holding bytes ``4j..4j+3`` and ``16+4j..16+4j+3`` (as two aarch64 ``sdot``
group them), converted to float32 and accumulated as ``acc = fma(lanes, d_w *
d_x, acc)``; Q4_1 and Q4_K add ``bias = fma(offset_w, s_x, bias)``; the row's
value ``(acc0 + acc1) + (acc2 + acc3)`` (``+ bias``). This file emits it as
LLVM vector IR (numba ``intrinsic``s), since numba's loops over a fixed
32-block unroll into scalar code. x86 has no signed x signed byte product:

- ``vnni``: ``vpdpbusd`` multiplies unsigned bytes by signed ones and adds each
  group of four into an int32 lane; on 128-bit vectors (``{vex}`` with AVX-VNNI,
  EVEX with AVX512-VNNI + VL) it gives exactly ``sdot``'s four lanes, two a
  sub-block. Q4_1's and Q4_K's nibbles (0-15) are unsigned already; Q8_0's and
  Q4_0's weights lend their sign to the activation (llama.cpp's trick):
  ``|w| * (sign(w) * x)``, which needs ``|w| <= 255`` (Q8_0's -128 becomes 128)
  and ``-x`` representable: the activations are in [-127, 127]
  (``quantize_q8_rows``: ``rint(x * 127 / max|x|)``).
- ``avx2``: ``vpmaddubsw`` (unsigned x signed bytes, adjacent pairs added into
  int16 with saturation) then ``vpmaddwd`` by ones (adjacent int16 pairs into
  int32), on the sub-block's 32 bytes in one ymm; the two halves' lanes added.
  No pair saturates: ``2 * 128 * 127 = 32512 < 32767``, again because the
  activations stay in [-127, 127] and the sign goes onto them.

The wide kernels hold several weight rows in one vector, 16 bytes (four
int32 lanes, four float32 accumulators) a row: four in a zmm ("vnni512"),
two in a ymm ("vnni256", AVX-VNNI without AVX-512; "avx2"), and take four
activation rows a pass, so each block is decoded once for all of them; there
Q8_0's bytes go in ``^ 0x80`` (its weights plus 128) and Q4_0's nibbles as
they are (plus 8), and the activation's own lanes times that offset start the
sum negated (:func:`_wide_dot`). The rows a vector does not fill go one at a
time (:func:`_rows_dot`). Integer sums are exact in any grouping, and every
float32 step is the reference's in its order, so each kernel equals the
reference bit for bit. A weight's
float16 scale is converted by the CPU (``vcvtph2ps``, F16C), which equals the
reference's table on every value. A kernel is compiled only for code that has
its instructions and run only on a CPU that has them (:func:`usable_kernel`).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["FORMS", "KINDS", "product_vnni512", "product_vnni256", "product_avx2", "form_id", "usable_kernel",
           "compiled_features"]

_I8x16 = ir.VectorType(ir.IntType(8), 16)
_I8x32 = ir.VectorType(ir.IntType(8), 32)
_I16x16 = ir.VectorType(ir.IntType(16), 16)
_I32x4 = ir.VectorType(ir.IntType(32), 4)
_I32x8 = ir.VectorType(ir.IntType(32), 8)
_F32 = ir.FloatType()
_F32x4 = ir.VectorType(_F32, 4)
_I64 = ir.IntType(64)

# Each form: (bytes a block, where its quants start, whether it has minimums, 32-weight sub-blocks a block). The
# dispatch takes an x86 kernel for exactly these forms (another form: the exact products on x86-64).
FORMS = {"Q8_0": (34, 2, False, 1), "Q4_0": (18, 2, False, 1), "Q4_1": (20, 4, True, 1), "Q4_K": (144, 16, True, 8)}
_FORM_IDS = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2, "Q4_K": 3}  # the reference's ``form`` argument, and these kernels'
_SIGNED = {"Q8_0": True, "Q4_0": True, "Q4_1": False, "Q4_K": False}  # weights below zero: the sign trick

# Kind of kernel (usable_kernel) -> its name for /health and the start-up line.
KINDS = {"vnni512": "vnni", "vnni256": "vnni", "avx2": "avx2"}
# LLVM x86 CPU names -> the features of ours they imply (where NUMBA_CPU_FEATURES leaves one unsaid).
_AVX2_CPUS = frozenset((
    "haswell", "broadwell", "skylake", "skylake-avx512", "cannonlake", "core-avx2", "x86-64-v3", "x86-64-v4", "knl",
    "knm", "znver1", "znver2", "znver3", "bdver4"))
_AVXVNNI_CPUS = frozenset((
    "alderlake", "raptorlake", "meteorlake", "arrowlake", "arrowlake-s", "lunarlake", "pantherlake", "gracemont",
    "sierraforest", "grandridge", "clearwaterforest", "sapphirerapids", "emeraldrapids", "graniterapids",
    "graniterapids-d", "diamondrapids"))
_AVX512VNNI_CPUS = frozenset((
    "cascadelake", "cooperlake", "icelake-client", "icelake-server", "rocketlake", "tigerlake", "sapphirerapids",
    "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids", "znver4", "znver5"))


def compiled_features(name: str | None = None, features: str | None = None) -> frozenset[str]:
    """The features among avx2, f16c, fma, avxvnni, avx512vnni, avx512vl, avx512bw (LLVM's names) that numba's
    code has, for choosing a kernel: of CPU ``name`` with feature string ``features`` (default: numba's, ``NUMBA_CPU_NAME`` and
    ``NUMBA_CPU_FEATURES``, else the host's). A feature the string names (``+avx2``, ``-avx2``) is as it says; one
    it leaves unsaid is the CPU name's (LLVM's reading). numba given a CPU name and no feature string compiles
    with the host's features: then a kernel takes only what the name implies as well, so that
    ``NUMBA_CPU_NAME=haswell`` chooses an AVX2 machine's kernel (its code can hold either)."""
    import llvmlite.binding as llvm
    from numba.core import config

    if name is None and _numbas:
        return _numbas[0]
    named_only, numbas = False, name is None
    if name is None:
        name, features = config.CPU_NAME, config.CPU_FEATURES
        if name in (None, "host"):
            name = llvm.get_host_cpu_name()
        elif features is None:
            named_only = True
        if features is None:
            features = llvm.get_host_cpu_features().flatten()
    said = {}
    for item in (features or "").split(","):
        item = item.strip()
        if item[:1] in "+-" and item[1:]:
            said[item[1:]] = item[0] == "+"
    name = name.lower()
    implied = set()
    if name in _AVX2_CPUS | _AVXVNNI_CPUS | _AVX512VNNI_CPUS:
        implied |= {"avx2", "f16c", "fma"}
    if name in _AVXVNNI_CPUS:
        implied.add("avxvnni")
    if name in _AVX512VNNI_CPUS | {"skylake-avx512", "x86-64-v4", "cannonlake"}:
        implied |= {"avx512vl", "avx512bw"}
    if name in _AVX512VNNI_CPUS:
        implied.add("avx512vnni")
    wanted = ("avx2", "f16c", "fma", "avxvnni", "avx512vnni", "avx512vl", "avx512bw")
    found = frozenset(f for f in wanted if said.get(f, f in implied) and (f in implied or not named_only))
    if numbas:  # numba reads its settings once, at import: so can we (LLVM's host query costs ~0.3 ms)
        _numbas.append(found)
    return found


_numbas: list[frozenset[str]] = []  # compiled_features() of numba's own settings, once known


def usable_kernel(runs, compiled: frozenset[str] | None = None) -> str | None:
    """The best kind of kernel (a key of KINDS) that numba's code can hold and this CPU can run, or None:
    ``runs(feature)`` is the CPU's word (``cpu.this_cpu().has``, our names: "avx2", "avxvnni", "avx512vnni"),
    ``compiled`` numba's (:func:`compiled_features`). LLVM encodes a 128/256-bit ``vpdpbusd`` as ``{vex}``
    (AVX-VNNI) when the code has avxvnni, else EVEX (AVX512-VNNI with VL), and a 512-bit one EVEX: the CPU must
    have the encodings the code will hold."""
    compiled = compiled_features() if compiled is None else compiled
    if not {"avx2", "f16c"} <= compiled or not runs("avx2"):
        return None
    narrow = runs("avxvnni") if "avxvnni" in compiled else ({"avx512vnni", "avx512vl"} <= compiled
                                                             and runs("avx512vnni"))
    if narrow and {"avx512vnni", "avx512bw", "avx512vl"} <= compiled and runs("avx512vnni"):
        return "vnni512"
    if narrow and "avxvnni" in compiled:
        return "vnni256"
    return "avx2"


def _splat(builder, value, vector):
    """``value`` in every lane of a ``vector``-typed vector."""
    first = builder.insert_element(ir.Constant(vector, None), value, ir.Constant(_I64, 0))
    lanes = ir.VectorType(ir.IntType(32), vector.count)
    return builder.shuffle_vector(first, ir.Constant(vector, None), ir.Constant(lanes, [0] * vector.count))


def _signs_moved(builder, w, x):
    """(|w| as unsigned bytes, sign(w) * x): the same byte products, the weight's sign on the activation (|x| <=
    127); a zero weight's product stays zero whatever the activation keeps."""
    negative = builder.icmp_signed("<", w, ir.Constant(w.type, None))
    return (builder.select(negative, builder.neg(w), w),  # -(-128) wraps to 0x80: 128 unsigned
            builder.select(negative, builder.neg(x), x))


def _lanes_vnni(builder, w0, w1, x0, x1, signed: bool):
    """A sub-block's int32 lane sums by two 128-bit ``vpdpbusd``: exactly ``sdot``'s lanes."""
    if signed:
        (w0, x0), (w1, x1) = _signs_moved(builder, w0, x0), _signs_moved(builder, w1, x1)
    dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32x4, [_I32x4, _I8x16, _I8x16]),
                                         "llvm.x86.avx512.vpdpbusd.128")
    lanes = builder.call(dot, [ir.Constant(_I32x4, None), w0, x0])  # [4] int32
    return builder.call(dot, [lanes, w1, x1])  # [4] int32


def _lanes_avx2(builder, w0, w1, x0, x1, signed: bool):
    """The same lane sums by ``vpmaddubsw`` + ``vpmaddwd`` on the sub-block's 32 bytes in one ymm, halves added."""
    if signed:
        (w0, x0), (w1, x1) = _signs_moved(builder, w0, x0), _signs_moved(builder, w1, x1)
    both = ir.Constant(ir.VectorType(ir.IntType(32), 32), list(range(32)))
    w, x = builder.shuffle_vector(w0, w1, both), builder.shuffle_vector(x0, x1, both)  # [32] int8 each
    pairs = builder.call(cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_I16x16, [_I8x32, _I8x32]), "llvm.x86.avx2.pmadd.ub.sw"), [w, x])  # [16] i16
    quads = builder.call(cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_I32x8, [_I16x16, _I16x16]), "llvm.x86.avx2.pmadd.wd"),
        [pairs, ir.Constant(_I16x16, [1] * 16)])  # [8] int32: lanes 0-3 of bytes 0-15, then of bytes 16-31
    low = builder.shuffle_vector(quads, quads, ir.Constant(_I32x4, [0, 1, 2, 3]))  # [4] int32
    high = builder.shuffle_vector(quads, quads, ir.Constant(_I32x4, [4, 5, 6, 7]))  # [4] int32
    return builder.add(low, high)


def _load16(builder, base, offset):
    """16 bytes at ``base + offset`` (bytes) as an int8x16 vector, any alignment."""
    return builder.load(builder.bitcast(builder.gep(base, [offset]), _I8x16.as_pointer()), align=1)


def _at(offset: int):
    return ir.Constant(_I64, offset)


def _nibbles(builder, vector, high: bool):
    """The low or high nibbles of an int8x16 vector's bytes, 0-15."""
    if high:
        return builder.lshr(vector, ir.Constant(_I8x16, [4] * 16))
    return builder.and_(vector, ir.Constant(_I8x16, [0x0F] * 16))


def _half_at(builder, at, offset: int):
    """The float16 at ``at + offset`` (bytes), as float32."""
    pointer = builder.bitcast(builder.gep(at, [ir.Constant(_I64, offset)]), ir.HalfType().as_pointer())
    return builder.fpext(builder.load(pointer, align=1), _F32)


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


def _sub_blocks(builder, form: str, at):
    """The block at ``at`` as its 32-weight sub-blocks: for each, its weights as two int8x16 vectors (weights
    0-15, 16-31; Q4_1's and Q4_K's unsigned), its float32 scale, and its float32 offset (Q4_1's minimum ``m``;
    Q4_K's ``min * -dmin``) or None."""
    quants = FORMS[form][1]
    if form == "Q8_0":
        return [(_load16(builder, at, _at(quants)), _load16(builder, at, _at(quants + 16)), _half_at(builder, at, 0),
                 None)]
    if form == "Q4_K":  # 8 sub-blocks: pair p's 32 bytes hold sub-block 2p in low nibbles, 2p + 1 in high ones
        d, minus_dmin = _half_at(builder, at, 0), builder.fneg(_half_at(builder, at, 2))
        found = []
        for pair in range(4):
            bytes0 = _load16(builder, at, _at(quants + 32 * pair))  # weights 0-15 of both sub-blocks
            bytes1 = _load16(builder, at, _at(quants + 32 * pair + 16))  # weights 16-31
            for high in (False, True):
                scale, low_min = _k_scale_min(builder, at, 2 * pair + high)
                found.append((_nibbles(builder, bytes0, high), _nibbles(builder, bytes1, high),
                              builder.fmul(d, builder.uitofp(scale, _F32)),
                              builder.fmul(builder.uitofp(low_min, _F32), minus_dmin)))
        return found
    nibbles = _load16(builder, at, _at(quants))  # [16] bytes: weight i low, weight 16 + i high
    low, high = _nibbles(builder, nibbles, False), _nibbles(builder, nibbles, True)
    if form == "Q4_0":
        eight = ir.Constant(_I8x16, [8] * 16)
        return [(builder.sub(low, eight), builder.sub(high, eight), _half_at(builder, at, 0), None)]
    return [(low, high, _half_at(builder, at, 0), _half_at(builder, at, 2))]


def _rows_dot(lanes_of, rows: int, form: str):
    """An intrinsic ``(data, r, xq, xd, xs, out, b, column) -> None``: ``form`` rows ``data[r : r + rows]``
    (uint8 [rows, blocks * block bytes], C order) against quantized activation row ``b`` (``xq`` int8 [N, blocks
    * 32], ``xd`` float32 [N, blocks]; ``xs`` float32 [N, blocks], the blocks' sums ``d_x * sum(q_x)``, read for
    Q4_1 and Q4_K only), into ``out[b, column : column + rows]``."""
    block_bytes, _, has_min, subs = FORMS[form]
    signed = _SIGNED[form]

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
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32x4, [_F32x4] * 3),
                                                 "llvm.fma.v4f32")
            fma1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3), "llvm.fma.f32")
            accs = [cgutils.alloca_once_value(builder, ir.Constant(_F32x4, None)) for _ in range(rows)]
            biases = [cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in range(rows)]
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
                for row_ptr, acc, bias in zip(row_ptrs, accs, biases):
                    at = builder.gep(row_ptr, [w_off])  # the block: float16 d (and m or dmin), scales, quants
                    for (w0, w1, scale_w, offset_w), (x0, x1, d_x, s_x) in zip(_sub_blocks(builder, form, at),
                                                                              activations):
                        if has_min:
                            builder.store(builder.call(fma1, [offset_w, s_x, builder.load(bias)]), bias)
                        splat = _splat(builder, builder.fmul(scale_w, d_x), _F32x4)  # [4] float32
                        lanes = builder.sitofp(lanes_of(builder, w0, w1, x0, x1, signed), _F32x4)  # [4] float32
                        builder.store(builder.call(fma, [lanes, splat, builder.load(acc)]), acc)
            for i, (acc, bias) in enumerate(zip(accs, biases)):
                a = builder.load(acc)
                parts = [builder.extract_element(a, ir.Constant(ir.IntType(32), j)) for j in range(4)]
                total = builder.fadd(builder.fadd(parts[0], parts[1]), builder.fadd(parts[2], parts[3]))
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


# ---------------------------------------------------------------- several rows in one vector

_ACTS = 4  # activation rows a pass of the wide kernels (their weights decoded once for all of them)
_SLOTS = {"vnni512": 4, "vnni256": 2, "avx2": 2}  # weight rows a vector holds, 16 bytes (4 int32 lanes) each


def _wide_lanes(builder, kind: str, slots: int, w0, w1, x0, x1, init):
    """``init`` + the int32 lane sums of ``slots`` rows at once: ``w0``/``w1`` [slots * 16] unsigned bytes (slot
    r: row r's weights 0-15 / 16-31), ``x0``/``x1`` the activation's 16 bytes in every slot; slot r's four lanes
    are row r's ``sdot`` lanes (lane j: bytes 4j..4j+3 of each half)."""
    width = slots * 4
    i32s, i8s = ir.VectorType(ir.IntType(32), width), ir.VectorType(ir.IntType(8), slots * 16)
    if kind.startswith("vnni"):
        dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32s, [i32s, i8s, i8s]),
                                             f"llvm.x86.avx512.vpdpbusd.{slots * 128}")
        return builder.call(dot, [builder.call(dot, [init, w0, x0]), w1, x1])  # [slots * 4] int32
    i16s = ir.VectorType(ir.IntType(16), slots * 8)
    maddubs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i16s, [i8s, i8s]),
                                             "llvm.x86.avx2.pmadd.ub.sw")
    maddwd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32s, [i16s, i16s]),
                                            "llvm.x86.avx2.pmadd.wd")
    ones = ir.Constant(i16s, [1] * (slots * 8))
    halves = [builder.call(maddwd, [builder.call(maddubs, [w, x]), ones]) for w, x in ((w0, x0), (w1, x1))]
    return builder.add(init, builder.add(*halves))  # [slots * 4] int32


def _concat(builder, vectors):
    """The vectors (of one type) end to end: [len * n]."""
    while len(vectors) > 1:
        n = vectors[0].type.count
        vectors = [builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), 2 * n), list(range(2 * n))))
                   for a, b in zip(vectors[::2], vectors[1::2])]
    return vectors[0]


def _spread(builder, scalars, each: int):
    """Scalars (float32) as a vector, each repeated ``each`` times: [len * each]."""
    vector = ir.Constant(ir.VectorType(_F32, len(scalars)), None)
    for i, value in enumerate(scalars):
        vector = builder.insert_element(vector, value, ir.Constant(ir.IntType(32), i))
    if each == 1:
        return vector
    n = len(scalars) * each
    return builder.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(ir.IntType(32), n),
                                                               [i // each for i in range(n)]))


def _k_scales(builder, at):
    """A Q4_K block's eight sub-block scales ``d * scale`` and offsets ``min * -dmin`` (float32 [8] each), from
    ggml's 6-bit packing of the 12 bytes at ``at + 4`` in vector operations (:func:`_k_scale_min`'s arithmetic:
    scale j < 4: q[j] & 63, else (q[j + 4] & 15) | (q[j - 4] >> 6) << 4; min j < 4: q[j + 4] & 63, else
    (q[j + 4] >> 4) | (q[j] >> 6) << 4)."""
    i32x8 = ir.VectorType(ir.IntType(32), 8)
    q = builder.zext(_load16(builder, at, _at(4)), ir.VectorType(ir.IntType(32), 16))  # [16]: bytes 4..19

    def pick(indices):
        return builder.shuffle_vector(q, q, ir.Constant(i32x8, indices))  # [8] int32

    def const(values):
        return ir.Constant(i32x8, values)

    top = const([0] * 4 + [-1] * 4)  # the high bits only where j >= 4
    high_bits = [builder.and_(builder.shl(builder.lshr(pick(src), const([6] * 8)), const([4] * 8)), top)
                 for src in ([0, 1, 2, 3, 0, 1, 2, 3], [4, 5, 6, 7, 4, 5, 6, 7])]  # for the scales, the mins
    scale = builder.or_(builder.and_(pick([0, 1, 2, 3, 8, 9, 10, 11]), const([63] * 4 + [15] * 4)), high_bits[0])
    low_min = builder.or_(builder.and_(builder.lshr(pick([4, 5, 6, 7, 8, 9, 10, 11]), const([0] * 4 + [4] * 4)),
                                       const([63] * 4 + [15] * 4)), high_bits[1])
    f32x8 = ir.VectorType(_F32, 8)
    d, minus_dmin = _half_at(builder, at, 0), builder.fneg(_half_at(builder, at, 2))
    return (builder.fmul(_spread(builder, [d], 8), builder.uitofp(scale, f32x8)),
            builder.fmul(builder.uitofp(low_min, f32x8), _spread(builder, [minus_dmin], 8)))


def _sub_block_raw(builder, form: str, at, sub: int, k_scales=None):
    """Sub-block ``sub`` of the block at ``at``: (its weights 0-15, 16-31 as int8x16 vectors, as stored: Q8_0's
    signed bytes, the nibbles 0-15 of the others (Q4_0's not less 8), its float32 scale, its offset or None).
    Q4_K: ``k_scales``, :func:`_k_scales` of the block."""
    quants = FORMS[form][1]
    if form == "Q8_0":
        return _load16(builder, at, _at(quants)), _load16(builder, at, _at(quants + 16)), _half_at(builder, at, 0), None
    if form == "Q4_K":
        pair, high = divmod(sub, 2)
        bytes0 = _load16(builder, at, _at(quants + 32 * pair))  # weights 0-15 of sub-blocks 2 * pair, 2 * pair + 1
        bytes1 = _load16(builder, at, _at(quants + 32 * pair + 16))  # weights 16-31
        scales, offsets = k_scales
        index = ir.Constant(ir.IntType(32), sub)
        return (_nibbles(builder, bytes0, bool(high)), _nibbles(builder, bytes1, bool(high)),
                builder.extract_element(scales, index), builder.extract_element(offsets, index))
    nibbles = _load16(builder, at, _at(quants))  # [16] bytes: weight i low, weight 16 + i high
    return (_nibbles(builder, nibbles, False), _nibbles(builder, nibbles, True), _half_at(builder, at, 0),
            _half_at(builder, at, 2) if form == "Q4_1" else None)


def _wide_dot(kind: str, form: str, acts: int):
    """An intrinsic ``(data, r, xq, xd, xs, out, b, column) -> None``: rows ``data[r : r + slots]`` of ``form``
    against activation rows ``b .. b + acts`` (arguments as :func:`_rows_dot`), into ``out[b + a, column + i]``:
    one vector holds a lane group of every row, each block's weights are decoded once for all ``acts`` rows.
    The weights' bytes go in unsigned: Q4_1's and Q4_K's nibbles as they are; Q4_0's nibbles are its weights
    plus 8 and Q8_0's bytes ``^ 0x80`` its weights plus 128, so each activation's own lanes times that offset
    (the same instruction on a splat of it) start the sum negated, exactly; AVX2's ``vpmaddubsw`` would
    saturate on ``255 * 127 * 2``, so there Q8_0's weights lend their sign to the activations instead."""
    block_bytes, _, has_min, subs = FORMS[form]
    slots = _SLOTS[kind]
    width = slots * 4  # int32 lanes (float32 accumulators) a vector
    sign_trick = kind == "avx2" and form == "Q8_0"
    offset = {"Q8_0": 128, "Q4_0": 8}.get(form) if not sign_trick else None
    i8s, i32s, f32s = (ir.VectorType(t, n) for t, n in ((ir.IntType(8), slots * 16), (ir.IntType(32), width),
                                                         (_F32, width)))
    f32r = ir.VectorType(_F32, slots)

    @intrinsic
    def wide_dot(typingctx, data, r, xq, xd, xs, out, b, column):
        def codegen(context, builder, signature, args):
            data_t, _, xq_t, xd_t, xs_t, out_t, _, _ = signature.args
            data_a = context.make_array(data_t)(context, builder, args[0])
            xq_a = context.make_array(xq_t)(context, builder, args[2])
            xd_a = context.make_array(xd_t)(context, builder, args[3])
            xs_a = context.make_array(xs_t)(context, builder, args[4])
            out_a = context.make_array(out_t)(context, builder, args[5])
            r, b, column = (context.cast(builder, v, t, types.intp) for v, t in
                            ((args[1], signature.args[1]), (args[6], signature.args[6]), (args[7], signature.args[7])))
            zero = _at(0)
            row_ptrs = [cgutils.get_item_pointer2(context, builder, data_a.data, cgutils.unpack_tuple(
                builder, data_a.shape, 2), cgutils.unpack_tuple(builder, data_a.strides, 2), "C",
                [builder.add(r, _at(i)), zero]) for i in range(slots)]  # uint8* each
            act_ptrs = [(cgutils.get_item_pointer(context, builder, xq_t, xq_a, [builder.add(b, _at(a)), zero]),
                         cgutils.get_item_pointer(context, builder, xd_t, xd_a, [builder.add(b, _at(a)), zero]),
                         cgutils.get_item_pointer(context, builder, xs_t, xs_a, [builder.add(b, _at(a)), zero]))
                        for a in range(acts)]  # (int8*, float*, float*) each
            units = builder.sdiv(builder.extract_value(xq_a.shape, 1), _at(32 * subs))  # blocks
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32s, [f32s] * 3),
                                                 f"llvm.fma.v{width}f32")
            fma_r = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32r, [f32r] * 3),
                                                   f"llvm.fma.v{slots}f32")
            accs = [cgutils.alloca_once_value(builder, ir.Constant(f32s, None)) for _ in range(acts)]  # [width]
            biases = [cgutils.alloca_once_value(builder, ir.Constant(f32r, None)) for _ in range(acts)]  # [slots]
            spread16 = ir.Constant(ir.VectorType(ir.IntType(32), slots * 16), [i % 16 for i in range(slots * 16)])
            with cgutils.for_range(builder, units) as loop:
                w_off = builder.mul(loop.index, _at(block_bytes))
                blocks = [builder.gep(row_ptr, [w_off]) for row_ptr in row_ptrs]
                k_scales = [_k_scales(builder, at) if form == "Q4_K" else None for at in blocks]
                for sub in range(subs):
                    found = [_sub_block_raw(builder, form, at, sub, ks) for at, ks in zip(blocks, k_scales)]
                    w0, w1 = (_concat(builder, [f[h] for f in found]) for h in (0, 1))  # [slots * 16] bytes each
                    if form == "Q8_0" and not sign_trick:
                        w0, w1 = (builder.xor(w, ir.Constant(i8s, [0x80] * (slots * 16))) for w in (w0, w1))
                    if sign_trick:
                        negative = [builder.icmp_signed("<", w, ir.Constant(i8s, None)) for w in (w0, w1)]
                        w0, w1 = (builder.select(n, builder.neg(w), w) for n, w in zip(negative, (w0, w1)))
                    scales = _spread(builder, [f[2] for f in found], 4)  # [width]: row r's scale in slot r
                    offsets = _spread(builder, [f[3] for f in found], 1) if has_min else None  # [slots]
                    k = builder.add(builder.mul(loop.index, _at(subs)), _at(sub))  # the 32-block
                    for (x_ptr, d_ptr, s_ptr), acc, bias in zip(act_ptrs, accs, biases):
                        x_at = builder.gep(x_ptr, [builder.mul(k, _at(32))])
                        x0, x1 = (builder.shuffle_vector(_load16(builder, x_at, _at(h)), ir.Constant(_I8x16, None),
                                                         spread16) for h in (0, 16))  # [slots * 16] each
                        init = ir.Constant(i32s, None)
                        if offset is not None:  # minus offset * the activation's lanes
                            lifted = ir.Constant(i8s, [offset] * (slots * 16))
                            init = builder.neg(_wide_lanes(builder, kind, slots, lifted, lifted, x0, x1, init))
                        if sign_trick:
                            x0, x1 = (builder.select(n, builder.neg(x), x) for n, x in zip(negative, (x0, x1)))
                        lanes = _wide_lanes(builder, kind, slots, w0, w1, x0, x1, init)  # [width] int32
                        d_x = builder.load(builder.gep(d_ptr, [k]))
                        if has_min:
                            s_x = _spread(builder, [builder.load(builder.gep(s_ptr, [k]))] * slots, 1)
                            builder.store(builder.call(fma_r, [offsets, s_x, builder.load(bias)]), bias)
                        step = builder.fmul(scales, _spread(builder, [d_x], width))  # [width]: scale_w * d_x
                        builder.store(builder.call(fma, [builder.sitofp(lanes, f32s), step, builder.load(acc)]), acc)
            for a, (acc, bias) in enumerate(zip(accs, biases)):
                vector = builder.load(acc)
                for i in range(slots):
                    parts = [builder.extract_element(vector, ir.Constant(ir.IntType(32), 4 * i + j)) for j in range(4)]
                    total = builder.fadd(builder.fadd(parts[0], parts[1]), builder.fadd(parts[2], parts[3]))
                    if has_min:
                        total = builder.fadd(total, builder.extract_element(builder.load(bias),
                                                                            ir.Constant(ir.IntType(32), i)))
                    builder.store(total, cgutils.get_item_pointer(
                        context, builder, out_t, out_a, [builder.add(b, _at(a)), builder.add(column, _at(i))]))
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

    return wide_dot


# The kernels a driver below calls, named, as numba needs them (module globals): per kind and form, the wide
# pass (slots rows x _ACTS activation rows), its one-activation-row form, and one row at a time for the rows left.
_ONE_ROW = {(lanes, form): _rows_dot(lanes, 1, form) for lanes in (_lanes_vnni, _lanes_avx2) for form in FORMS}
_q8_0_vnni512, _q8_0_vnni512_a1 = _wide_dot("vnni512", "Q8_0", _ACTS), _wide_dot("vnni512", "Q8_0", 1)
_q8_0_vnni256, _q8_0_vnni256_a1 = _wide_dot("vnni256", "Q8_0", _ACTS), _wide_dot("vnni256", "Q8_0", 1)
_q8_0_avx2, _q8_0_avx2_a1 = _wide_dot("avx2", "Q8_0", _ACTS), _wide_dot("avx2", "Q8_0", 1)
_q8_0_vnni_row, _q8_0_avx2_row = _ONE_ROW[_lanes_vnni, "Q8_0"], _ONE_ROW[_lanes_avx2, "Q8_0"]
_q4_0_vnni512, _q4_0_vnni512_a1 = _wide_dot("vnni512", "Q4_0", _ACTS), _wide_dot("vnni512", "Q4_0", 1)
_q4_0_vnni256, _q4_0_vnni256_a1 = _wide_dot("vnni256", "Q4_0", _ACTS), _wide_dot("vnni256", "Q4_0", 1)
_q4_0_avx2, _q4_0_avx2_a1 = _wide_dot("avx2", "Q4_0", _ACTS), _wide_dot("avx2", "Q4_0", 1)
_q4_0_vnni_row, _q4_0_avx2_row = _ONE_ROW[_lanes_vnni, "Q4_0"], _ONE_ROW[_lanes_avx2, "Q4_0"]
_q4_1_vnni512, _q4_1_vnni512_a1 = _wide_dot("vnni512", "Q4_1", _ACTS), _wide_dot("vnni512", "Q4_1", 1)
_q4_1_vnni256, _q4_1_vnni256_a1 = _wide_dot("vnni256", "Q4_1", _ACTS), _wide_dot("vnni256", "Q4_1", 1)
_q4_1_avx2, _q4_1_avx2_a1 = _wide_dot("avx2", "Q4_1", _ACTS), _wide_dot("avx2", "Q4_1", 1)
_q4_1_vnni_row, _q4_1_avx2_row = _ONE_ROW[_lanes_vnni, "Q4_1"], _ONE_ROW[_lanes_avx2, "Q4_1"]
_q4_k_vnni512, _q4_k_vnni512_a1 = _wide_dot("vnni512", "Q4_K", _ACTS), _wide_dot("vnni512", "Q4_K", 1)
_q4_k_vnni256, _q4_k_vnni256_a1 = _wide_dot("vnni256", "Q4_K", _ACTS), _wide_dot("vnni256", "Q4_K", 1)
_q4_k_avx2, _q4_k_avx2_a1 = _wide_dot("avx2", "Q4_K", _ACTS), _wide_dot("avx2", "Q4_K", 1)
_q4_k_vnni_row, _q4_k_avx2_row = _ONE_ROW[_lanes_vnni, "Q4_K"], _ONE_ROW[_lanes_avx2, "Q4_K"]


# One compiled function a kind, the form chosen by an argument (``_FORM_IDS``) outside the loops: numba caches
# neither a function a factory makes nor one handed a kernel, so the kernels are named here. Compile (call) one
# only where usable_kernel names its kind: LLVM cannot select an instruction for code without it.
@njit(nogil=True, cache=True)
def product_vnni512(form, data, xq, xd, xs, start, stop, out):
    """``out`` [N, stop-start] = the quantized activations ``xq`` int8 [N, cols] / ``xd``, ``xs`` float32 [N,
    cols/32] (scales, block sums) @ rows ``data`` uint8 [start:stop, ...] of form ``form`` (0: Q8_0, 1: Q4_0,
    2: Q4_1, 3: Q4_K), by ``vpdpbusd``: four rows in a zmm, four activation rows a pass (AVX512-VNNI + BW), the
    rows left one at a time in xmm."""
    n = xq.shape[0]
    r = start
    while r + 4 <= stop:
        b = 0
        while b + 4 <= n:
            if form == 0:
                _q8_0_vnni512(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_vnni512(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_vnni512(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_vnni512(data, r, xq, xd, xs, out, b, r - start)
            b += 4
        for b in range(b, n):
            if form == 0:
                _q8_0_vnni512_a1(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_vnni512_a1(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_vnni512_a1(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_vnni512_a1(data, r, xq, xd, xs, out, b, r - start)
        r += 4
    for r in range(r, stop):
        for b in range(n):
            if form == 0:
                _q8_0_vnni_row(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_vnni_row(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_vnni_row(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_vnni_row(data, r, xq, xd, xs, out, b, r - start)


@njit(nogil=True, cache=True)
def product_vnni256(form, data, xq, xd, xs, start, stop, out):
    """As :func:`product_vnni512` with two rows in a ymm (AVX-VNNI without AVX-512)."""
    n = xq.shape[0]
    r = start
    while r + 2 <= stop:
        b = 0
        while b + 4 <= n:
            if form == 0:
                _q8_0_vnni256(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_vnni256(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_vnni256(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_vnni256(data, r, xq, xd, xs, out, b, r - start)
            b += 4
        for b in range(b, n):
            if form == 0:
                _q8_0_vnni256_a1(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_vnni256_a1(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_vnni256_a1(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_vnni256_a1(data, r, xq, xd, xs, out, b, r - start)
        r += 2
    for r in range(r, stop):
        for b in range(n):
            if form == 0:
                _q8_0_vnni_row(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_vnni_row(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_vnni_row(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_vnni_row(data, r, xq, xd, xs, out, b, r - start)


@njit(nogil=True, cache=True)
def product_avx2(form, data, xq, xd, xs, start, stop, out):
    """As :func:`product_vnni512` by ``vpmaddubsw`` + ``vpmaddwd``, two rows in a ymm (AVX2)."""
    n = xq.shape[0]
    r = start
    while r + 2 <= stop:
        b = 0
        while b + 4 <= n:
            if form == 0:
                _q8_0_avx2(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_avx2(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_avx2(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_avx2(data, r, xq, xd, xs, out, b, r - start)
            b += 4
        for b in range(b, n):
            if form == 0:
                _q8_0_avx2_a1(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_avx2_a1(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_avx2_a1(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_avx2_a1(data, r, xq, xd, xs, out, b, r - start)
        r += 2
    for r in range(r, stop):
        for b in range(n):
            if form == 0:
                _q8_0_avx2_row(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_avx2_row(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_avx2_row(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_avx2_row(data, r, xq, xd, xs, out, b, r - start)


def form_id(form: str) -> int:
    """The kernels' ``form`` argument for a form name of FORMS."""
    return _FORM_IDS[form]
