"""Every GGUF block form x int8 block dot products for x86-64: ``vpdpbusd`` (AVX-512 VNNI or AVX-VNNI), AVX2.

Theory of operation: the portable reference (``_kernels.portable.integer.product_blocks``)
fixes the arithmetic: per 32-weight sub-block one int32 sum of its products
(Q6_K's two halves each times its int8 scale first), converted to float32 and
accumulated as ``acc = fma(sum, d_w * d_x, acc)``, one float32 a row and
activation row; the forms with minimums add ``bias = fma(offset_w, s_x,
bias)``; the row's value ``acc`` (``+ bias``). This file emits it as LLVM
vector IR (numba ``intrinsic``s), since numba's loops over a fixed 32-block
unroll into scalar code. A weight row's 16-byte half of a block fills four
int32 lanes (lane ``j``: bytes ``4j..4j+3``, as ``vpdpbusd`` groups them);
x86 has no signed x signed byte product:

- ``vnni``: ``vpdpbusd`` multiplies unsigned bytes by signed ones and adds each
  group of four into an int32 lane; on 128-bit vectors (``{vex}`` with AVX-VNNI,
  EVEX with AVX512-VNNI + VL) it gives exactly ``sdot``'s four lanes.
- ``avx2``: ``vpmaddubsw`` (unsigned x signed bytes, adjacent pairs added into
  int16 with saturation) then ``vpmaddwd`` by ones (adjacent int16 pairs into
  int32). No pair saturates while the unsigned bytes stay <= 128: ``2 * 128 *
  127 = 32512 < 32767``, because the activations are in [-127, 127]
  (``quantize_q8_rows``: ``rint(x * 127 / max|x|)``).

The weights go in unsigned: the forms with minimums' quants (Q4_1, Q4_K 0-15;
Q5_1, Q5_K 0-31) as stored; the signed forms' as stored too, which is the
weight plus an offset (Q4_0 8, Q5_0 16, Q6_K 32; Q8_0's bytes ``^ 0x80``,
plus 128), and the activation's own lanes times that offset (the same
instruction on a splat of it) come off the sum, exactly. On AVX2 Q8_0's
weights lend their sign to the activations instead (llama.cpp's trick,
``|w| * (sign(w) * x)``), as 255 would saturate.

A pass takes eight weight rows (four a zmm, "vnni512") or four (two a ymm:
"vnni256", AVX-VNNI without AVX-512; "avx2") against four activation rows
(:func:`_emit_wide`), so each block is decoded once for all of them, and
reduces every (row, activation row)'s lanes together, by a tree of even + odd
lane shuffles (:func:`_reduce_blocks`), into one int32 vector of block sums:
one conversion, one ``vmulps`` (the rows' scales times the activation rows'
``d_x``, each gathered by one permutation) and one ``vfmadd`` a block then
serve all 32 (16) pairs, lane by lane, and the pairs' fma chains run side by
side. Each pass prefetches the next pass's rows as it goes (several rows'
short streams outran the CPU's own prefetch). The rows left over go one at a
time in an xmm. Each driver takes the
form as an argument, switched on inside the kernel (:func:`_dispatching`).
Integer sums are exact in any grouping, and every float32 step is the
reference's in its order, so each kernel equals the reference bit for bit.
A weight's float16 scale is converted by the CPU (``vcvtph2ps``, F16C), which
equals the reference's table on every value. A kernel is compiled only for
code that has its instructions and run only on a CPU that has them
(:func:`usable_kernel`).

One file over the house's ~500 lines, on purpose: the drivers are cached by
numba (``cache=True``), and numba invalidates a cached function only when its
own file changes, so the IR they inline stays in this file with them; split
apart, an edit of the IR would leave stale machine code in every cache.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from kestrel_trio._kernels.portable import handoff

__all__ = ["FORMS", "KINDS", "product_vnni512", "product_vnni256", "product_avx2", "form_id", "usable_kernel",
           "compiled_features", "job_entry"]

_I8x16 = ir.VectorType(ir.IntType(8), 16)
_I32x4 = ir.VectorType(ir.IntType(32), 4)
_F32 = ir.FloatType()
_I64 = ir.IntType(64)

# Each form: (bytes a block, where its quants start, whether it has minimums, 32-weight sub-blocks a block). The
# dispatch takes an x86 kernel for exactly these forms (another form: the exact products on x86-64).
FORMS = {"Q8_0": (34, 2, False, 1), "Q4_0": (18, 2, False, 1), "Q4_1": (20, 4, True, 1), "Q4_K": (144, 16, True, 8),
         "Q5_0": (22, 6, False, 1), "Q5_1": (24, 8, True, 1), "Q5_K": (176, 48, True, 8), "Q6_K": (210, 0, False, 8)}
# The reference's ``form`` argument, and these kernels'.
_FORM_IDS = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2, "Q4_K": 3, "Q5_0": 4, "Q5_1": 5, "Q5_K": 6, "Q6_K": 7}

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
    code has, for choosing a kernel: of CPU ``name`` with feature string ``features`` (default: numba's,
    ``NUMBA_CPU_NAME`` and ``NUMBA_CPU_FEATURES``, else the host's). A feature the string names (``+avx2``,
    ``-avx2``) is as it says; one it leaves unsaid is the CPU name's (LLVM's reading). numba given a CPU name and
    no feature string compiles with the host's features: then a kernel takes only what the name implies as well,
    so that ``NUMBA_CPU_NAME=haswell`` chooses an AVX2 machine's kernel (its code can hold either)."""
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


def _load16(builder, base, offset):
    """16 bytes at ``base + offset`` (bytes) as an int8x16 vector, any alignment."""
    return builder.load(builder.bitcast(builder.gep(base, [offset]), _I8x16.as_pointer()), align=1)


def _at(offset: int):
    return ir.Constant(_I64, offset)


def _splat8(value: int, n: int):
    """An int8 vector [n] of ``value``."""
    return ir.Constant(ir.VectorType(ir.IntType(8), n), [value] * n)


def _nibbles(builder, vector, high: bool):
    """The low or high nibbles of an int8 vector's bytes, 0-15."""
    n = vector.type.count
    return builder.lshr(vector, _splat8(4, n)) if high else builder.and_(vector, _splat8(0x0F, n))


def _fifth_bits(builder, ats, offset: int):
    """Q5_0's and Q5_1's fifth bits of the blocks at ``ats`` (bit i of the little-endian uint32 at ``at +
    offset``: weight i's) as 16 or 0 in two int8 vectors [16 * len(ats)], weights 0-15 and 16-31 of each block
    end to end."""
    i8x4 = ir.VectorType(ir.IntType(8), 4)
    words = _concat(builder, [builder.load(builder.bitcast(builder.gep(at, [_at(offset)]), i8x4.as_pointer()),
                                           align=1) for at in ats])  # [4 * len] bytes
    n = 16 * len(ats)
    found = []
    for first in (0, 2):
        spread = builder.shuffle_vector(words, words, ir.Constant(ir.VectorType(ir.IntType(32), n), [
            4 * (i // 16) + first + (i % 16) // 8 for i in range(n)]))  # [n] bytes
        bit = builder.and_(spread, ir.Constant(spread.type, [1 << (i % 8) for i in range(n)]))
        found.append(builder.select(builder.icmp_unsigned("!=", bit, _splat8(0, n)), _splat8(16, n), _splat8(0, n)))
    return found


# ---------------------------------------------------------------- several rows in one vector

_ACTS = 4  # activation rows a pass of the wide kernels (their weights decoded once for all of them)


def _half_lanes(builder, kind: str, slots: int, w, x, init):
    """``init`` + the int32 lane sums of one 16-byte half of ``slots`` rows at once: ``w`` [slots * 16] unsigned
    bytes (slot r: row r's), ``x`` the activation's 16 bytes in every slot; lane j of a slot: bytes 4j..4j+3, as
    ``sdot`` groups them. VNNI: one ``vpdpbusd``; AVX2: ``vpmaddubsw`` (no pair saturates: ``2 * 255 * 127``
    would, so no weight byte here is above 127 where AVX2 runs: Q8_0's take the sign trick) then ``vpmaddwd``
    by ones; one row (``slots`` 1) in an xmm."""
    width = slots * 4
    i32s, i8s = ir.VectorType(ir.IntType(32), width), ir.VectorType(ir.IntType(8), slots * 16)
    if kind.startswith("vnni"):
        dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32s, [i32s, i8s, i8s]),
                                             f"llvm.x86.avx512.vpdpbusd.{slots * 128}")
        return builder.call(dot, [init, w, x])  # [slots * 4] int32
    i16s = ir.VectorType(ir.IntType(16), slots * 8)
    names = ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd") if slots == 2 else (
        "llvm.x86.ssse3.pmadd.ub.sw.128", "llvm.x86.sse2.pmadd.wd")
    maddubs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i16s, [i8s, i8s]), names[0])
    maddwd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32s, [i16s, i16s]), names[1])
    return builder.add(init, builder.call(maddwd, [builder.call(maddubs, [w, x]), ir.Constant(i16s, [1] * slots * 8)]))


def _block_lanes_avx2(builder, slots: int, w0, x0, w1, x1):
    """A block's int32 lane sums of ``slots`` rows by AVX2 with one ``vpmaddwd`` for both halves: their
    ``vpmaddubsw`` int16 pairs added first. Exact for weights 0-63 (every form but Q8_0): 4 * 63 * 127 = 32004 <
    32767; the lanes group other bytes than ``vpdpbusd``'s, each slot's still its row's alone."""
    i16s = ir.VectorType(ir.IntType(16), slots * 8)
    i8s, i32s = ir.VectorType(ir.IntType(8), slots * 16), ir.VectorType(ir.IntType(32), slots * 4)
    names = ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd") if slots == 2 else (
        "llvm.x86.ssse3.pmadd.ub.sw.128", "llvm.x86.sse2.pmadd.wd")
    maddubs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i16s, [i8s, i8s]), names[0])
    maddwd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32s, [i16s, i16s]), names[1])
    pairs = builder.add(builder.call(maddubs, [w0, x0]), builder.call(maddubs, [w1, x1]))  # [slots * 8] int16
    return builder.call(maddwd, [pairs, ir.Constant(i16s, [1] * slots * 8)])


def _concat(builder, vectors):
    """The vectors (of one type) end to end: [len * n]."""
    while len(vectors) > 1:
        n = vectors[0].type.count
        vectors = [builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), 2 * n), list(range(2 * n))))
                   for a, b in zip(vectors[::2], vectors[1::2])]
    return vectors[0]


def _spread(builder, scalars, each: int):
    """Scalars (all float32 or all int32) as a vector, each repeated ``each`` times: [len * each]."""
    vector = ir.Constant(ir.VectorType(scalars[0].type, len(scalars)), None)
    for i, value in enumerate(scalars):
        vector = builder.insert_element(vector, value, ir.Constant(ir.IntType(32), i))
    if each == 1:
        return vector
    n = len(scalars) * each
    return builder.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(ir.IntType(32), n),
                                                               [i // each for i in range(n)]))


def _k_scales(builder, ats):
    """The Q4_K or Q5_K blocks at ``ats``' (one a row) eight sub-block scales ``d * scale`` and offsets ``min *
    -dmin`` (float32 [8 * rows] each, lane ``j * rows + row``: sub-block j's of every row side by side), from
    ggml's 6-bit packing of the 12 bytes at ``at + 4`` in vector operations on all the rows at once (the
    reference's ``_k_scale_min``: scale j < 4: q[j] & 63, else (q[j + 4] & 15) | (q[j - 4] >> 6) << 4; min j <
    4: q[j + 4] & 63, else (q[j + 4] >> 4) | (q[j] >> 6) << 4)."""
    rows = len(ats)
    n = 8 * rows
    i32n = ir.VectorType(ir.IntType(32), n)
    q = _concat(builder, [_load16(builder, at, _at(4)) for at in ats])  # [16 * rows] bytes: each row's 4..19

    def pick(indices):  # lane j * rows + row: byte indices[j] of the row's, as int32
        return builder.zext(builder.shuffle_vector(q, q, ir.Constant(i32n, [
            16 * (i % rows) + indices[i // rows] for i in range(n)])), i32n)  # [n] int32

    def const(values):  # values[j] in sub-block j's lanes
        return ir.Constant(i32n, [values[i // rows] for i in range(n)])

    top = const([0] * 4 + [-1] * 4)  # the high bits only where j >= 4
    high_bits = [builder.and_(builder.shl(builder.lshr(pick(src), const([6] * 8)), const([4] * 8)), top)
                 for src in ([0, 1, 2, 3, 0, 1, 2, 3], [4, 5, 6, 7, 4, 5, 6, 7])]  # for the scales, the mins
    scale = builder.or_(builder.and_(pick([0, 1, 2, 3, 8, 9, 10, 11]), const([63] * 4 + [15] * 4)), high_bits[0])
    low_min = builder.or_(builder.and_(builder.lshr(pick([4, 5, 6, 7, 8, 9, 10, 11]), const([0] * 4 + [4] * 4)),
                                       const([63] * 4 + [15] * 4)), high_bits[1])
    f32n = ir.VectorType(_F32, n)
    every = ir.Constant(i32n, [i % rows for i in range(n)])  # lane j * rows + row: the row's
    d = _halves_at(builder, ats, 0)  # [rows]
    minus_dmin = builder.fneg(_halves_at(builder, ats, 2))  # [rows]
    return (builder.fmul(builder.shuffle_vector(d, d, every), builder.uitofp(scale, f32n)),
            builder.fmul(builder.uitofp(low_min, f32n), builder.shuffle_vector(minus_dmin, minus_dmin, every)))


def _group_weights(builder, form: str, ats, sub: int):
    """Sub-block ``sub`` of the blocks at ``ats`` (one a row): its weights 0-15 and 16-31 as stored, each as
    an int8 vector [16 * len(ats)] (row i's in bytes 16i..16i+15), decoded on the rows' bytes end to end so
    each operation serves every row. Q8_0's signed bytes; the others' unsigned, 0-15 or with the fifth bit
    (sixth: Q6_K) 0-31 (0-63), Q4_0's, Q5_0's, Q6_K's not less 8, 16, 32 (:data:`_OFFSETS`)."""
    quants = FORMS[form][1]
    n = 16 * len(ats)

    def load(offset: int):  # [n] bytes: each row's 16 at ``offset``
        return _concat(builder, [_load16(builder, at, _at(offset)) for at in ats])

    if form == "Q8_0":
        return load(quants), load(quants + 16)
    if form in ("Q4_K", "Q5_K"):
        pair, high = divmod(sub, 2)
        # weights 0-15, 16-31 of sub-blocks 2 * pair (low nibbles) and 2 * pair + 1 (high)
        w0, w1 = (_nibbles(builder, load(quants + 32 * pair + h), bool(high)) for h in (0, 16))
        if form == "Q5_K":  # bit ``sub`` of byte i of the 32 at 16: weight i's fifth
            w0, w1 = (builder.or_(w, builder.shl(builder.and_(builder.lshr(load(16 + h), _splat8(sub, n)),
                                                              _splat8(1, n)), _splat8(4, n)))
                      for w, h in ((w0, 0), (w1, 16)))
        return w0, w1
    if form == "Q6_K":  # half = sub // 4 of 128 weights; quarter: which nibbles, which two high bits
        half, quarter = divmod(sub, 4)
        low_at, high_at = 64 * half + 32 * (quarter % 2), 128 + 32 * half
        found = []
        for h in (0, 16):
            nibbles = _nibbles(builder, load(low_at + h), quarter >= 2)
            high = builder.and_(builder.lshr(load(high_at + h), _splat8(2 * quarter, n)), _splat8(3, n))
            found.append(builder.or_(nibbles, builder.shl(high, _splat8(4, n))))
        return found[0], found[1]
    nibbles = load(quants)  # [n] bytes: weight i low, weight 16 + i high
    w0, w1 = _nibbles(builder, nibbles, False), _nibbles(builder, nibbles, True)
    if form in ("Q5_0", "Q5_1"):
        fifth = _fifth_bits(builder, ats, quants - 4)
        w0, w1 = builder.or_(w0, fifth[0]), builder.or_(w1, fifth[1])
    return w0, w1


def _halves_at(builder, ats, offset: int):
    """The float16s at ``at + offset`` of each block at ``ats`` as float32 [len(ats)], converted at once
    (``vcvtph2ps``): inserted into a vector of zeros, which the CPU knows depends on nothing, so the inserts do
    not wait on whatever register LLVM would otherwise merge them into (an accumulator, at worst)."""
    i16 = ir.IntType(16)
    vector = ir.Constant(ir.VectorType(i16, len(ats)), [0] * len(ats))
    for i, at in enumerate(ats):
        half = builder.load(builder.bitcast(builder.gep(at, [_at(offset)]), i16.as_pointer()), align=1)
        vector = builder.insert_element(vector, half, ir.Constant(ir.IntType(32), i))
    return builder.fpext(builder.bitcast(vector, ir.VectorType(ir.HalfType(), len(ats))),
                         ir.VectorType(_F32, len(ats)))


# Each signed form's weights as stored (_group_weights) are the weights plus this; Q8_0's after ``^ 0x80``.
_OFFSETS = {"Q8_0": 128, "Q4_0": 8, "Q5_0": 16, "Q6_K": 32}


def _reduce_blocks(builder, vectors, slots: int):
    """Each slot's four int32 lanes summed: ``vectors`` (a power of two of them, [slots * 4] int32 each, slot s
    lanes 4s..4s+3) as one vector [len * slots], lane ``i * slots + s`` vector i's slot s. Two levels of
    even + odd lanes: two vectors' concatenation (or one vector's own halves, once one is left), so each level is
    two shuffles and one add (exact: integers)."""
    for _ in range(2):
        if len(vectors) == 1:
            n = vectors[0].type.count
            pairs = [(vectors[0], vectors[0], n // 2)]
        else:
            pairs = [(a, b, a.type.count) for a, b in zip(vectors[::2], vectors[1::2])]
        vectors = [builder.add(*(builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), n), list(
            range(parity, 2 * n, 2))[:n])) for parity in (0, 1))) for a, b, n in pairs]
    while len(vectors) > 1:  # the sums themselves, end to end
        vectors = [_concat(builder, vectors[i : i + 2]) for i in range(0, len(vectors), 2)]
    return vectors[0]


def _emit_wide(context, builder, signature, args, kind: str, form: str, acts: int, slots: int, groups: int,
               first: int = 0):
    """Rows ``data[r + first : r + first + groups * slots]`` of ``form`` against activation rows ``b .. b + acts``
    into ``out[b + a, column + first + i]`` (arguments: :func:`_dispatching`'s after ``form``): a vector holds a
    lane group of ``slots`` rows, ``groups`` such vectors a pass, each block's weights decoded once for all
    ``acts`` rows. Each (group, activation row)'s lanes reduced together (:func:`_reduce_blocks`) into one int32
    vector of block sums, lane ``(g * acts + a) * slots + s``, so one conversion, one ``fmul`` and one ``fma``
    serve every (row, activation row) of the pass (its float32 steps the reference's, lane by lane); the rows'
    scales come from :func:`_halves_at` or :func:`_k_scales`, each sub-block's by one permutation. The weights'
    bytes go in unsigned: the
    forms with minimums' as they are, the signed forms' plus :data:`_OFFSETS` (Q8_0's ``^ 0x80``), so each
    activation's own lanes times that offset (the same instruction on a splat of it) come off the sum, exactly;
    AVX2's ``vpmaddubsw`` would saturate on ``255 * 127 * 2``, so there Q8_0's weights lend their sign to the
    activations instead (``|w| * (sign(w) * x)``; ``|-128|`` is 128 unsigned). Q6_K's halves are scaled apart,
    in int32."""
    block_bytes, _, has_min, subs = FORMS[form]
    width = slots * 4  # int32 lanes a vector
    pairs = groups * acts * slots  # (row, activation row) pairs a pass: the lanes of the float32 vectors
    sign_trick = kind == "avx2" and form == "Q8_0"
    offset = None if sign_trick else _OFFSETS.get(form)
    i8s, i32s = ir.VectorType(ir.IntType(8), slots * 16), ir.VectorType(ir.IntType(32), width)
    f32p = ir.VectorType(_F32, pairs)
    data_t, _, xq_t, xd_t, xs_t, out_t, _, _ = signature.args
    data_a = context.make_array(data_t)(context, builder, args[0])
    xq_a = context.make_array(xq_t)(context, builder, args[2])
    xd_a = context.make_array(xd_t)(context, builder, args[3])
    xs_a = context.make_array(xs_t)(context, builder, args[4])
    out_a = context.make_array(out_t)(context, builder, args[5])
    r, b, column = (builder.add(context.cast(builder, args[i], signature.args[i], types.intp), _at(at))
                    for i, at in ((1, first), (6, 0), (7, first)))
    zero = _at(0)
    row_ptrs = [cgutils.get_item_pointer2(context, builder, data_a.data, cgutils.unpack_tuple(
        builder, data_a.shape, 2), cgutils.unpack_tuple(builder, data_a.strides, 2), "C",
        [builder.add(r, _at(i)), zero]) for i in range(groups * slots)]  # uint8* each
    act_ptrs = [(cgutils.get_item_pointer(context, builder, xq_t, xq_a, [builder.add(b, _at(a)), zero]),
                 cgutils.get_item_pointer(context, builder, xd_t, xd_a, [builder.add(b, _at(a)), zero]),
                 cgutils.get_item_pointer(context, builder, xs_t, xs_a, [builder.add(b, _at(a)), zero]))
                for a in range(acts)]  # (int8*, float*, float*) each
    units = builder.sdiv(builder.extract_value(xq_a.shape, 1), _at(32 * subs))  # blocks
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32p, [f32p] * 3), f"llvm.fma.v{pairs}f32")
    acc = cgutils.alloca_once_value(builder, ir.Constant(f32p, None))  # [pairs]
    bias = cgutils.alloca_once_value(builder, ir.Constant(f32p, None))  # [pairs]
    i32p = ir.VectorType(ir.IntType(32), pairs)
    # lane (g * acts + a) * slots + s: the row's (g * slots + s) value, the activation row's (a)
    rows_of = [(i // (acts * slots)) * slots + i % slots for i in range(pairs)]
    row_of = ir.Constant(i32p, rows_of)
    act_of = ir.Constant(i32p, [(i // slots) % acts for i in range(pairs)])
    spread16 = ir.Constant(ir.VectorType(ir.IntType(32), slots * 16), [i % 16 for i in range(slots * 16)])
    no_lanes = ir.Constant(i32s, None)
    lifted = ir.Constant(i8s, [offset or 0] * (slots * 16))
    # The next pass's rows (right after these in memory, as one stretch), prefetched a stretch a block along this
    # pass: without it the rows' several short streams (18 bytes a row and block for Q4_0) outran the CPU's own
    # prefetch when the weights come from memory (Zen 5, Qwen3-0.6B's layer, benchmarks/compute/bench_integer.py).
    stride = builder.extract_value(data_a.strides, 0)  # bytes a row
    pass_bytes = groups * slots * block_bytes  # a block of each row of the pass
    ahead = builder.add(builder.ptrtoint(row_ptrs[0], _I64), builder.mul(stride, _at(groups * slots)))
    prefetch = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [
        ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(32), ir.IntType(32)]), "llvm.prefetch.p0i8")
    with cgutils.for_range(builder, units) as loop:
        w_off = builder.mul(loop.index, _at(block_bytes))
        blocks = [builder.gep(row_ptr, [w_off]) for row_ptr in row_ptrs]
        stretch = builder.add(ahead, builder.mul(loop.index, _at(pass_bytes)))
        for line in range(0, pass_bytes, 64):  # read, into every cache level; x86 prefetches never fault
            builder.call(prefetch, [builder.inttoptr(builder.add(stretch, _at(line)), ir.IntType(8).as_pointer()),
                                    ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), 3),
                                    ir.Constant(ir.IntType(32), 1)])
        if form in ("Q4_K", "Q5_K"):  # every row's eight scales, offsets: [8 * rows] each, sub-block-major
            block_scales, block_offsets = _k_scales(builder, blocks)
        if form == "Q6_K":  # each row's sixteen int8 scales (two a 32-block), as stored: [slots * 16] a group
            q6_scales = [_concat(builder, [_load16(builder, at, _at(192))
                                           for at in blocks[g * slots : (g + 1) * slots]]) for g in range(groups)]
        for sub in range(subs):
            k = builder.add(builder.mul(loop.index, _at(subs)), _at(sub))  # the 32-block
            xs = []  # each activation row's two 16-byte halves in every slot, [slots * 16] each
            for x_ptr, _, _ in act_ptrs:
                x_at = builder.gep(x_ptr, [builder.mul(k, _at(32))])
                xs.append([builder.shuffle_vector(_load16(builder, x_at, _at(h)), ir.Constant(_I8x16, None), spread16)
                           for h in (0, 16)])
            corrections = []  # each activation row's lanes times the offset, [width] (the same in every slot)
            if offset is not None and form != "Q6_K":
                corrections = [_half_lanes(builder, kind, slots, lifted, x1, _half_lanes(
                    builder, kind, slots, lifted, x0, no_lanes)) for x0, x1 in xs]
            lane_vectors = []  # [width] int32 each, (group, activation row) in order
            for g in range(groups):
                w0, w1 = _group_weights(builder, form, blocks[g * slots : (g + 1) * slots], sub)  # [slots * 16] each
                if form == "Q8_0" and not sign_trick:
                    w0, w1 = (builder.xor(w, ir.Constant(i8s, [0x80] * (slots * 16))) for w in (w0, w1))
                if sign_trick:
                    negative = [builder.icmp_signed("<", w, ir.Constant(i8s, None)) for w in (w0, w1)]
                    w0, w1 = (builder.select(n, builder.neg(w), w) for n, w in zip(negative, (w0, w1)))
                int_scales = None
                if form == "Q6_K":  # [width] int32 each: slot s's four lanes row s's scale of half h
                    int_scales = [builder.sext(builder.shuffle_vector(q6_scales[g], q6_scales[g], ir.Constant(
                        ir.VectorType(ir.IntType(32), width), [(i // 4) * 16 + 2 * sub + h for i in range(width)])),
                        i32s) for h in (0, 1)]
                for a, (x0, x1) in enumerate(xs):
                    if int_scales is not None:  # s0 * (w0 . x0 - 32 * sum x0) + s1 * (...), lane by lane, in int32
                        halves = [builder.mul(builder.sub(_half_lanes(builder, kind, slots, w, x, no_lanes),
                                                          _half_lanes(builder, kind, slots, lifted, x, no_lanes)), s)
                                  for w, x, s in zip((w0, w1), (x0, x1), int_scales)]
                        lanes = builder.add(*halves)  # [width] int32
                    else:
                        if sign_trick:
                            x0, x1 = (builder.select(n, builder.neg(x), x) for n, x in zip(negative, (x0, x1)))
                        if kind == "avx2" and form != "Q8_0":
                            lanes = _block_lanes_avx2(builder, slots, w0, x0, w1, x1)
                        else:
                            lanes = _half_lanes(builder, kind, slots, w1, x1,
                                                _half_lanes(builder, kind, slots, w0, x0, no_lanes))
                        if corrections:  # minus offset * the activation's lanes
                            lanes = builder.sub(lanes, corrections[a])
                    lane_vectors.append(lanes)
            sums = _reduce_blocks(builder, lane_vectors, slots)  # [pairs] int32: each pair's block sum
            d_x = _spread(builder, [builder.load(builder.gep(d_ptr, [k])) for _, d_ptr, _ in act_ptrs], 1)
            if form in ("Q4_K", "Q5_K"):  # lane i: its row's scale of this sub-block, one permutation
                scales = builder.shuffle_vector(block_scales, block_scales, ir.Constant(i32p, [
                    sub * len(blocks) + row for row in rows_of]))  # [pairs]
            else:
                scales = _halves_at(builder, blocks, 208 if form == "Q6_K" else 0)  # [groups * slots]: d
                scales = builder.shuffle_vector(scales, scales, row_of)  # [pairs]
            step = builder.fmul(scales, builder.shuffle_vector(d_x, d_x, act_of))  # [pairs]: scale_w * d_x
            builder.store(builder.call(fma, [builder.sitofp(sums, f32p), step, builder.load(acc)]), acc)
            if has_min:
                s_x = _spread(builder, [builder.load(builder.gep(s_ptr, [k])) for _, _, s_ptr in act_ptrs], 1)
                if form in ("Q4_K", "Q5_K"):
                    offsets = builder.shuffle_vector(block_offsets, block_offsets, ir.Constant(i32p, [
                        sub * len(blocks) + row for row in rows_of]))  # [pairs]
                else:
                    offsets = _halves_at(builder, blocks, 2)  # [groups * slots]: Q4_1's, Q5_1's m
                    offsets = builder.shuffle_vector(offsets, offsets, row_of)  # [pairs]
                builder.store(builder.call(fma, [offsets, builder.shuffle_vector(s_x, s_x, act_of),
                                                 builder.load(bias)]), bias)
    total = builder.load(acc)
    if has_min:
        total = builder.fadd(total, builder.load(bias))
    for i in range(pairs):
        row, a = (i // (acts * slots)) * slots + i % slots, (i // slots) % acts
        builder.store(builder.extract_element(total, ir.Constant(ir.IntType(32), i)), cgutils.get_item_pointer(
            context, builder, out_t, out_a, [builder.add(b, _at(a)), builder.add(column, _at(row))]))


def _passes(kind: str, form: str, acts: int, slots: int, groups: int) -> list[tuple[int, int]]:
    """How one call's ``groups * slots`` rows go: (first row, vectors) a pass. On a zmm the 256-weight forms
    against several activation rows take their rows four at a time (16 (row, activation row) pairs: their
    scales' decoding and lanes in fewer registers), as measured faster on a Zen 5; else all in one pass."""
    if kind == "vnni512" and acts > 1 and FORMS[form][3] > 1:
        return [(g * slots, 1) for g in range(groups)]
    return [(0, groups)]


def _dispatching(kind: str, acts: int, slots: int, groups: int = 1):
    """An intrinsic ``(form, data, r, xq, xd, xs, out, b, column) -> None``: :func:`_emit_wide` for the form
    whose id (``_FORM_IDS``) ``form`` holds, by a switch over every form's code: rows ``data[r : r + groups *
    slots]``
    (uint8 [rows, blocks * block bytes], C order) against activation rows ``b .. b + acts`` (``xq`` int8 [N,
    blocks * 32], ``xd`` float32 [N, blocks]; ``xs`` float32 [N, blocks], the blocks' sums ``d_x * sum(q_x)``,
    read for the forms with minimums only), into ``out[b + a, column + i]``."""

    @intrinsic
    def dispatching(typingctx, form, data, r, xq, xd, xs, out, b, column):
        def codegen(context, builder, signature, args):
            inner = types.void(*signature.args[1:])
            which = context.cast(builder, args[0], signature.args[0], types.int64)
            done = builder.append_basic_block("form_done")
            switch = builder.switch(which, done)
            for name, number in _FORM_IDS.items():
                case = builder.append_basic_block(f"form_{name}")
                switch.add_case(ir.Constant(ir.IntType(64), number), case)
                builder.position_at_end(case)
                for first, pass_groups in _passes(kind, name, acts, slots, groups):
                    _emit_wide(context, builder, inner, args[1:], kind, name, acts, slots, pass_groups, first)
                builder.branch(done)
            builder.position_at_end(done)
            return context.get_dummy_value()

        if not (isinstance(form, types.Integer) and isinstance(r, types.Integer) and isinstance(b, types.Integer)
                and isinstance(column, types.Integer)):
            return None
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
        return types.void(form, data, r, xq, xd, xs, out, b, column), codegen

    return dispatching


# Weight rows a pass of each kind's wide kernels: (rows a vector, vectors a pass). Every form goes several rows a
# pass, so that the one float32 fma a row and block serves many (row, activation row) pairs in one instruction;
# measured on a Zen 5 EPYC (benchmarks/RESULTS.md).
_PASS = {"vnni512": (4, 2), "vnni256": (2, 2), "avx2": (2, 2)}
_ROWS512, _ROWS256 = _PASS["vnni512"][0] * _PASS["vnni512"][1], _PASS["vnni256"][0] * _PASS["vnni256"][1]
_ROWS_AVX2 = _PASS["avx2"][0] * _PASS["avx2"][1]

# The kernels a driver below calls, named, as numba needs them (module globals): per kind, the wide pass (_PASS
# rows x _ACTS activation rows) and its one-activation-row form; and one row in an xmm (the rows left over),
# against _ACTS activation rows or one.
_vnni512_wide, _vnni512_a1 = _dispatching("vnni512", _ACTS, *_PASS["vnni512"]), _dispatching(
    "vnni512", 1, *_PASS["vnni512"])
_vnni256_wide, _vnni256_a1 = _dispatching("vnni256", _ACTS, *_PASS["vnni256"]), _dispatching(
    "vnni256", 1, *_PASS["vnni256"])
_avx2_wide, _avx2_a1 = _dispatching("avx2", _ACTS, *_PASS["avx2"]), _dispatching("avx2", 1, *_PASS["avx2"])
_vnni_row, _vnni_row_a1 = _dispatching("vnni256", _ACTS, 1), _dispatching("vnni256", 1, 1)
_avx2_row, _avx2_row_a1 = _dispatching("avx2", _ACTS, 1), _dispatching("avx2", 1, 1)


# One compiled function a kind, the form chosen by an argument (``_FORM_IDS``) in the kernels' switch: numba
# caches neither a function a factory makes nor one handed a kernel, so the kernels are named here. Compile (call)
# one only where usable_kernel names its kind: LLVM cannot select an instruction for code without it.
@njit(nogil=True, cache=True)
def product_vnni512(form, data, xq, xd, xs, start, stop, out):
    """``out`` [N, stop-start] = the quantized activations ``xq`` int8 [N, cols] / ``xd``, ``xs`` float32 [N,
    cols/32] (scales, block sums) @ rows ``data`` uint8 [start:stop, ...] of form ``form`` (``form_id``: 0 Q8_0,
    1 Q4_0, 2 Q4_1, 3 Q4_K, 4 Q5_0, 5 Q5_1, 6 Q5_K, 7 Q6_K), by ``vpdpbusd``, four activation rows and eight
    weight rows a pass (four a zmm: AVX512-VNNI + BW + VL), the rows left over one at a time in an xmm."""
    n = xq.shape[0]
    r = start
    while r + _ROWS512 <= stop:
        b = 0
        while b + _ACTS <= n:
            _vnni512_wide(form, data, r, xq, xd, xs, out, b, r - start)
            b += _ACTS
        for b in range(b, n):
            _vnni512_a1(form, data, r, xq, xd, xs, out, b, r - start)
        r += _ROWS512
    for r in range(r, stop):
        b = 0
        while b + _ACTS <= n:
            _vnni_row(form, data, r, xq, xd, xs, out, b, r - start)
            b += _ACTS
        for b in range(b, n):
            _vnni_row_a1(form, data, r, xq, xd, xs, out, b, r - start)


@njit(nogil=True, cache=True)
def product_vnni256(form, data, xq, xd, xs, start, stop, out):
    """As :func:`product_vnni512` with two rows a ymm, four a pass (AVX-VNNI without AVX-512)."""
    n = xq.shape[0]
    r = start
    while r + _ROWS256 <= stop:
        b = 0
        while b + _ACTS <= n:
            _vnni256_wide(form, data, r, xq, xd, xs, out, b, r - start)
            b += _ACTS
        for b in range(b, n):
            _vnni256_a1(form, data, r, xq, xd, xs, out, b, r - start)
        r += _ROWS256
    for r in range(r, stop):
        b = 0
        while b + _ACTS <= n:
            _vnni_row(form, data, r, xq, xd, xs, out, b, r - start)
            b += _ACTS
        for b in range(b, n):
            _vnni_row_a1(form, data, r, xq, xd, xs, out, b, r - start)


@njit(nogil=True, cache=True)
def product_avx2(form, data, xq, xd, xs, start, stop, out):
    """As :func:`product_vnni512` by ``vpmaddubsw`` + ``vpmaddwd``, two rows a ymm, four a pass (AVX2)."""
    n = xq.shape[0]
    r = start
    while r + _ROWS_AVX2 <= stop:
        b = 0
        while b + _ACTS <= n:
            _avx2_wide(form, data, r, xq, xd, xs, out, b, r - start)
            b += _ACTS
        for b in range(b, n):
            _avx2_a1(form, data, r, xq, xd, xs, out, b, r - start)
        r += _ROWS_AVX2
    for r in range(r, stop):
        b = 0
        while b + _ACTS <= n:
            _avx2_row(form, data, r, xq, xd, xs, out, b, r - start)
            b += _ACTS
        for b in range(b, n):
            _avx2_row_a1(form, data, r, xq, xd, xs, out, b, r - start)


def form_id(form: str) -> int:
    """The kernels' ``form`` argument for a form name of FORMS."""
    return _FORM_IDS[form]


# Each kernel's job entry (kestrel_trio._kernels.portable.handoff: a product's share run by another thread in compiled
# code), here beside its kernel so that an edit of either refreshes numba's cache of both.
_JOB_LAYOUT = "job-2"  # handoff's job row layout these entries were written for (handoff.entry checks it)


def _job_vnni512(row):
    product_vnni512(*handoff.job_arrays(row))


def _job_vnni256(row):
    product_vnni256(*handoff.job_arrays(row))


def _job_avx2(row):
    product_avx2(*handoff.job_arrays(row))


_JOBS = {"product_vnni512": _job_vnni512, "product_vnni256": _job_vnni256, "product_avx2": _job_avx2}


def job_entry(kernel: str) -> int:
    """The address of kernel ``kernel``'s (e.g. "product_vnni512") job entry, compiled or loaded from numba's cache on
    first use."""
    return handoff.entry(_JOBS[kernel], _JOB_LAYOUT)
