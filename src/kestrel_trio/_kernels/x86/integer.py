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

Integer sums are exact in any grouping, and every float32 step is the
reference's in its order, so each kernel equals the reference bit for bit.
Rows go four at a time, sharing the activation loads and the loop. A weight's
float16 scale is converted by the CPU (``vcvtph2ps``, F16C), which equals the
reference's table on every value. A kernel is compiled only for code that has
its instructions and run only on a CPU that has them (:func:`usable_kernel`).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["FORMS", "KERNELS", "product_vnni", "product_avx2", "form_id", "usable_kernel", "compiled_features"]

_I8x16 = ir.VectorType(ir.IntType(8), 16)
_I8x32 = ir.VectorType(ir.IntType(8), 32)
_I16x16 = ir.VectorType(ir.IntType(16), 16)
_I32x4 = ir.VectorType(ir.IntType(32), 4)
_I32x8 = ir.VectorType(ir.IntType(32), 8)
_F32 = ir.FloatType()
_F32x4 = ir.VectorType(_F32, 4)
_I64 = ir.IntType(64)
_ROWS = 4  # weight rows a pass

# Each form: (bytes a block, where its quants start, whether it has minimums, 32-weight sub-blocks a block). The
# dispatch takes an x86 kernel for exactly these forms (another form: the exact products on x86-64).
FORMS = {"Q8_0": (34, 2, False, 1), "Q4_0": (18, 2, False, 1), "Q4_1": (20, 4, True, 1), "Q4_K": (144, 16, True, 8)}
_FORM_IDS = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2, "Q4_K": 3}  # the reference's ``form`` argument, and these kernels'
_SIGNED = {"Q8_0": True, "Q4_0": True, "Q4_1": False, "Q4_K": False}  # weights below zero: the sign trick

# Kernel name (for /health and the start-up line) -> the features the code numba compiles must have and the CPU
# must run; "vnni" takes either encoding of vpdpbusd (usable_kernel).
KERNELS = ("vnni", "avx2")
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
    """The features among avx2, f16c, fma, avxvnni, avx512vnni, avx512vl (LLVM's names) that numba's code has, for
    choosing a kernel: of CPU ``name`` with feature string ``features`` (default: numba's, ``NUMBA_CPU_NAME`` and
    ``NUMBA_CPU_FEATURES``, else the host's). A feature the string names (``+avx2``, ``-avx2``) is as it says; one
    it leaves unsaid is the CPU name's (LLVM's reading). numba given a CPU name and no feature string compiles
    with the host's features: then a kernel takes only what the name implies as well, so that
    ``NUMBA_CPU_NAME=haswell`` chooses an AVX2 machine's kernel (its code can hold either)."""
    import llvmlite.binding as llvm
    from numba.core import config

    named_only = False
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
        implied.add("avx512vl")
    if name in _AVX512VNNI_CPUS:
        implied.add("avx512vnni")
    wanted = ("avx2", "f16c", "fma", "avxvnni", "avx512vnni", "avx512vl")
    return frozenset(f for f in wanted if said.get(f, f in implied) and (f in implied or not named_only))


def usable_kernel(runs, compiled: frozenset[str] | None = None) -> str | None:
    """The best of KERNELS that numba's code can hold and this CPU can run, or None: ``runs(feature)`` is the CPU's
    word (``cpu.this_cpu().has``, our names: "avx2", "avxvnni", "avx512vnni"), ``compiled`` numba's
    (:func:`compiled_features`). LLVM encodes ``vpdpbusd`` as ``{vex}`` (AVX-VNNI) when the code has avxvnni, else
    EVEX (AVX512-VNNI with VL): the CPU must have the one the code will hold."""
    compiled = compiled_features() if compiled is None else compiled
    if not {"avx2", "f16c"} <= compiled or not runs("avx2"):
        return None
    if "avxvnni" in compiled:
        vnni = runs("avxvnni")
    else:
        vnni = {"avx512vnni", "avx512vl"} <= compiled and runs("avx512vnni")
    return "vnni" if vnni else "avx2"


def _splat(builder, value, vector):
    return builder.shuffle_vector(builder.insert_element(ir.Constant(vector, None), value, ir.Constant(_I64, 0)),
                                  ir.Constant(vector, None), ir.Constant(ir.VectorType(ir.IntType(32),
                                                                                       vector.count), [0] * vector.count))


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


_KERNELS = {(lanes.__name__, form, rows): _rows_dot(lanes, rows, form)
            for lanes in (_lanes_vnni, _lanes_avx2) for form in FORMS for rows in (_ROWS, 1)}
_q8_0_vnni, _q8_0_vnni_1 = _KERNELS["_lanes_vnni", "Q8_0", _ROWS], _KERNELS["_lanes_vnni", "Q8_0", 1]
_q4_0_vnni, _q4_0_vnni_1 = _KERNELS["_lanes_vnni", "Q4_0", _ROWS], _KERNELS["_lanes_vnni", "Q4_0", 1]
_q4_1_vnni, _q4_1_vnni_1 = _KERNELS["_lanes_vnni", "Q4_1", _ROWS], _KERNELS["_lanes_vnni", "Q4_1", 1]
_q4_k_vnni, _q4_k_vnni_1 = _KERNELS["_lanes_vnni", "Q4_K", _ROWS], _KERNELS["_lanes_vnni", "Q4_K", 1]
_q8_0_avx2, _q8_0_avx2_1 = _KERNELS["_lanes_avx2", "Q8_0", _ROWS], _KERNELS["_lanes_avx2", "Q8_0", 1]
_q4_0_avx2, _q4_0_avx2_1 = _KERNELS["_lanes_avx2", "Q4_0", _ROWS], _KERNELS["_lanes_avx2", "Q4_0", 1]
_q4_1_avx2, _q4_1_avx2_1 = _KERNELS["_lanes_avx2", "Q4_1", _ROWS], _KERNELS["_lanes_avx2", "Q4_1", 1]
_q4_k_avx2, _q4_k_avx2_1 = _KERNELS["_lanes_avx2", "Q4_K", _ROWS], _KERNELS["_lanes_avx2", "Q4_K", 1]


# One compiled function a kernel, the form chosen by an argument (``_FORM_IDS``) outside the loops: numba caches
# neither a function a factory makes nor one handed a kernel, so the kernels are named here. Compile (call) one
# only where usable_kernel names it: LLVM cannot select the instruction for code without it.
@njit(nogil=True, cache=True)
def product_vnni(form, data, xq, xd, xs, start, stop, out):
    """``out`` [N, stop-start] = the quantized activations ``xq`` int8 [N, cols] / ``xd``, ``xs`` float32 [N,
    cols/32] (scales, block sums) @ rows ``data`` uint8 [start:stop, ...] of form ``form`` (0: Q8_0, 1: Q4_0,
    2: Q4_1, 3: Q4_K), by ``vpdpbusd`` (AVX-VNNI or AVX512-VNNI), four rows a pass."""
    r = start
    while r + 4 <= stop:
        for b in range(xq.shape[0]):
            if form == 0:
                _q8_0_vnni(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_vnni(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_vnni(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_vnni(data, r, xq, xd, xs, out, b, r - start)
        r += 4
    for last in range(r, stop):
        for b in range(xq.shape[0]):
            if form == 0:
                _q8_0_vnni_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 1:
                _q4_0_vnni_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 2:
                _q4_1_vnni_1(data, last, xq, xd, xs, out, b, last - start)
            else:
                _q4_k_vnni_1(data, last, xq, xd, xs, out, b, last - start)


@njit(nogil=True, cache=True)
def product_avx2(form, data, xq, xd, xs, start, stop, out):
    """As :func:`product_vnni` by ``vpmaddubsw`` + ``vpmaddwd`` (AVX2)."""
    r = start
    while r + 4 <= stop:
        for b in range(xq.shape[0]):
            if form == 0:
                _q8_0_avx2(data, r, xq, xd, xs, out, b, r - start)
            elif form == 1:
                _q4_0_avx2(data, r, xq, xd, xs, out, b, r - start)
            elif form == 2:
                _q4_1_avx2(data, r, xq, xd, xs, out, b, r - start)
            else:
                _q4_k_avx2(data, r, xq, xd, xs, out, b, r - start)
        r += 4
    for last in range(r, stop):
        for b in range(xq.shape[0]):
            if form == 0:
                _q8_0_avx2_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 1:
                _q4_0_avx2_1(data, last, xq, xd, xs, out, b, last - start)
            elif form == 2:
                _q4_1_avx2_1(data, last, xq, xd, xs, out, b, last - start)
            else:
                _q4_k_avx2_1(data, last, xq, xd, xs, out, b, last - start)


def form_id(form: str) -> int:
    """The kernels' ``form`` argument for a form name of FORMS."""
    return _FORM_IDS[form]
