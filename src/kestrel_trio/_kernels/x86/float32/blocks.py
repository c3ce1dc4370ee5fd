"""float32, bf16 and int8 weight rows multiplied in x86-64 assembly blocks (AVX2, AVX-512), from four activation rows.

The products of kestrel_trio._kernels.portable.products for x86-64 CPUs whose
plan (kestrel_trio._kernels.plan) takes an assembly block:
:func:`product_f32_avx512` (Intel's AVX-512: 3x8 and 3x4 zmm blocks, the 6x4 one
from WIDE_BLOCK_ROWS rows), :func:`product_f32_avx2` (the 3x4 ymm block),
:func:`product_f32_avx2_avx512` (the ymm block, the 6x4 zmm one from
WIDE_BLOCK_ROWS rows: what the plan gives a CPU whose AVX-512 loses the 3x8
block to AVX2's, as AMD's Zen 4 and 5); :func:`product_bf16_avx2` and
:func:`product_int8_avx2` widen bf16 and int8 rows in their registers in the ymm
block. The rows and columns the blocks leave take the portable loops
(kestrel_trio._kernels.portable.forms: the dot loops, bf16's and int8's homes),
which the tests compare each block against (tests/model/test_kernel_plan.py).

numba caches each product with this file's stamp: a change here recompiles
them, a change to the portable loops they call in portable/forms does not
(numba checks a cached function's own file only). After editing those loops,
clear numba's cache of this file (its ``__pycache__/blocks.*`` entries).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from kestrel_trio._kernels.portable.forms.dots import _dot_rows, _f32_rest
from kestrel_trio._kernels.portable.forms.floats import _bf16_rows, row_bf16
from kestrel_trio._kernels.portable.forms.kestrel import _int8_rows, row_int8
from kestrel_trio._kernels.x86.float32.assembly import _ZMM, _asm_codegen

__all__ = ["product_f32_avx512", "product_f32_avx2", "product_f32_avx2_avx512", "product_bf16_avx2",
           "product_int8_avx2", "WIDE_BLOCK_ROWS"]

# ---------------------------------------------------------------- float32, bf16 and int8 rows in assembly (x86-64)
# LLVM compiles _dot_block_3x8's 24 accumulators, 8 activation vectors and a weight vector into 33 zmm
# registers of 32: on Zen 5 it spilled and rotated registers every pass (about 50 register moves a pass),
# and 8 rows cost 2.5-3x one row. Written as a few instructions of assembly instead, a block of three weight
# rows by eight (or four) activation rows keeps its accumulators, the three weight vectors and one activation
# vector in at most 28 registers. Each call also asks for a share of the next block's weight rows
# (prefetcht2, into L2): a product of 16 rows makes two passes over a block, and without it the memory sat idle
# during the second, served from L1. Measured on the 2-core Zen 5, 2 threads, 3072 x 1024 weights from
# memory, ns a weight: 8 rows 0.14-0.15 against 0.35 for the compiled loop, 16 rows 0.21 against 0.31.
#
# AVX2 has 16 ymm registers: the 3x4 block fills them exactly (12 sums, 3 weight vectors, 1 activation
# vector), and sums its lanes itself (three vhaddps and a 128-bit add per weight row), so each call leaves 12
# floats rather than 96 lanes to add up. The AVX-512 blocks do the same after adding each zmm's two halves, so
# a 3x8 call leaves 24 floats, not 384 lanes for a numba loop to add.

# Operands at the address in $0, int64 [8]: weight row 0's address, the weight rows' stride (bytes),
# activation row 0's address, its stride, passes (cols / lanes), the scratch the sums go to, where to
# prefetch, bytes to advance that a pass.
_LOAD_OPERANDS = ["mov 0($0), %r8", "mov 8($0), %r9", "mov 16($0), %r10", "mov 24($0), %r11",
                  "lea (%r11,%r11,2), %r12", "lea (%r10,%r11,4), %r13", "mov 32($0), %rcx", "mov 48($0), %rsi",
                  "mov 56($0), %rdi"]
_WEIGHT_ROWS = ["(%r8)", "(%r8,%r9,1)", "(%r8,%r9,2)"]
# Six weight rows: the last three from r14 (row 3's address), prefetched from rsi and rdx (three rows on).
_WEIGHT_ROWS_6 = _WEIGHT_ROWS + ["(%r14)", "(%r14,%r9,1)", "(%r14,%r9,2)"]
_PREFETCH_ROWS_6 = _WEIGHT_ROWS + ["(%rdx)", "(%rdx,%r9,1)", "(%rdx,%r9,2)"]
_SIX_ROW_OPERANDS = ["lea (%r9,%r9,2), %r14", "lea (%rsi,%r14,1), %rdx", "add %r8, %r14"]
_ACTIVATION_ROWS = ["(%r10)", "(%r10,%r11,1)", "(%r10,%r11,2)", "(%r10,%r12,1)",
                    "(%r13)", "(%r13,%r11,1)", "(%r13,%r11,2)", "(%r13,%r12,1)"]


def _block_passes(reg: str, rows: int, w_reg: int, x_reg: int, vector_bytes: int, weight_rows: int = 3,
                  weights_form: str = "f32") -> list[str]:
    """The loop of a ``weight_rows`` x ``rows`` block: sums in registers 0.. (weight row i, activation row r at
    i*rows+r), the weight rows' vectors from register ``w_reg``, an activation's in ``x_reg``.

    ``weights_form`` "bf16": the weight rows hold bf16 bits, half a float32 vector's bytes a pass, each widened
    in its register (zero-extended to 32 bits and shifted into a float32's top half: exact). "int8": int8
    quants, a quarter of the bytes, sign-extended and converted (exact); the caller scales the sums.
    """
    weights, prefetches = (_WEIGHT_ROWS, _WEIGHT_ROWS) if weight_rows == 3 else (_WEIGHT_ROWS_6, _PREFETCH_ROWS_6)
    lines = ["1:"]
    for i, at in enumerate(weights):
        w = f"%{reg}{w_reg + i}"
        lines += {"f32": [f"vmovups {at}, {w}"],
                  "bf16": [f"vpmovzxwd {at}, {w}", f"vpslld $$16, {w}, {w}"],
                  "int8": [f"vpmovsxbd {at}, {w}", f"vcvtdq2ps {w}, {w}"]}[weights_form]
    lines += [f"prefetcht2 {at.replace('%r8', '%rsi')}" for at in prefetches]
    lines.append("add %rdi, %rsi")
    if weight_rows == 6:
        lines.append("add %rdi, %rdx")
    for r, at in enumerate(_ACTIVATION_ROWS[:rows]):
        lines.append(f"vmovups {at}, %{reg}{x_reg}")
        lines += [f"vfmadd231ps %{reg}{x_reg}, %{reg}{w_reg + i}, %{reg}{i * rows + r}" for i in range(weight_rows)]
    weight_bytes = vector_bytes // {"f32": 1, "bf16": 2, "int8": 4}[weights_form]
    lines += [f"add $${weight_bytes}, %r8", f"add $${vector_bytes}, %r10", f"add $${vector_bytes}, %r13"]
    if weight_rows == 6:
        lines.append(f"add $${vector_bytes}, %r14")
    lines += ["dec %rcx", "jnz 1b", "mov 40($0), %rax"]
    return lines


def _sum_four_ymm(a: int, offset: int) -> list[str]:
    """Lanes of ymm{a}..ymm{a+3} summed (pairs, then quads, then the two halves); the 4 sums stored at offset($rax).

    VEX code: registers 0-15 only (vhaddps has no EVEX form).
    """
    return [f"vhaddps %ymm{a + 1}, %ymm{a}, %ymm{a}", f"vhaddps %ymm{a + 3}, %ymm{a + 2}, %ymm{a + 2}",
            f"vhaddps %ymm{a + 2}, %ymm{a}, %ymm{a}", f"vextractf128 $$1, %ymm{a}, %xmm{a + 1}",
            f"vaddps %xmm{a + 1}, %xmm{a}, %xmm{a}", f"vmovups %xmm{a}, {offset}(%rax)"]


def _f32_block_text(rows: int, weight_rows: int = 3) -> str:
    """The AVX-512 ``weight_rows`` x ``rows`` block (3x8, 3x4 or 6x4): the scratch gets its sums (weight row i,
    activation row r at i*rows+r).

    The lanes are summed here: each zmm's halves added (256 bits), then four ymm at a time as in the AVX2
    block. Sums in registers 16 and up are first moved down into registers a finished group freed.
    """
    sums = weight_rows * rows
    x_reg = 24 + weight_rows  # zmm24..: the weight rows' vectors, then an activation's
    lines = _LOAD_OPERANDS + (_SIX_ROW_OPERANDS if weight_rows == 6 else [])
    lines += [f"vpxord %zmm{a}, %zmm{a}, %zmm{a}" for a in range(sums)]
    lines += _block_passes("zmm", rows, 24, x_reg, 64, weight_rows)
    for a in range(sums):
        lines += [f"vextractf64x4 $$1, %zmm{a}, %ymm{x_reg}", f"vaddps %ymm{x_reg}, %ymm{a}, %ymm{a}"]
    for a in range(0, sums, 4):
        low = a if a < 16 else 0  # group 0 is done by then: its registers are free
        lines += [f"vmovaps %ymm{a + k}, %ymm{low + k}" for k in range(4) if low != a]
        lines += _sum_four_ymm(low, 4 * a)
    lines.append("vzeroupper")
    return "\n".join(lines)


def _f32_avx2_block_text(weights_form: str = "f32") -> str:
    """The AVX2 3x4 block: the scratch gets the 12 sums, [3, 4] (weight row i, activation row r), of weight rows
    of ``weights_form`` (:func:`_block_passes`)."""
    lines = _LOAD_OPERANDS + [f"vxorps %ymm{a}, %ymm{a}, %ymm{a}" for a in range(12)]
    lines += _block_passes("ymm", 4, 12, 15, 32, weights_form=weights_form)  # ymm12-14: the weights, ymm15: x's
    for i in range(3):  # lanes [r0 r1 r2 r3] of weight row i
        lines += _sum_four_ymm(4 * i, 16 * i)
    lines.append("vzeroupper")
    return "\n".join(lines)




@intrinsic
def _f32_3x8(typingctx, operands):
    """The AVX-512 3x8 block (:func:`_f32_block_text`); ``operands``: the address of its int64 [8] operands."""
    return types.void(types.int64), _asm_codegen(_f32_block_text(8), _ZMM)


@intrinsic
def _f32_3x4(typingctx, operands):
    """The AVX-512 3x4 block (:func:`_f32_block_text`); ``operands``: the address of its int64 [8] operands."""
    return types.void(types.int64), _asm_codegen(_f32_block_text(4), _ZMM)


@intrinsic
def _f32_6x4(typingctx, operands):
    """The AVX-512 6x4 block (:func:`_f32_block_text`); ``operands``: the address of its int64 [8] operands."""
    return types.void(types.int64), _asm_codegen(_f32_block_text(4, 6), _ZMM)


@intrinsic
def _f32_3x4_avx2(typingctx, operands):
    """The AVX2 3x4 block (:func:`_f32_avx2_block_text`); ``operands``: the address of its int64 [8] operands."""
    return types.void(types.int64), _asm_codegen(_f32_avx2_block_text(), [f"ymm{i}" for i in range(16)])


@intrinsic
def _bf16_3x4_avx2(typingctx, operands):
    """The AVX2 3x4 block of bf16 weight rows (:func:`_f32_avx2_block_text`)."""
    return types.void(types.int64), _asm_codegen(_f32_avx2_block_text("bf16"), [f"ymm{i}" for i in range(16)])


@intrinsic
def _int8_3x4_avx2(typingctx, operands):
    """The AVX2 3x4 block of int8 weight rows, unscaled (:func:`_f32_avx2_block_text`)."""
    return types.void(types.int64), _asm_codegen(_f32_avx2_block_text("int8"), [f"ymm{i}" for i in range(16)])


@njit(nogil=True)
def _reduce_block(scratch, rows, out, b, column, weight_rows=3):
    """out[b:b+rows, column:column+weight_rows] = the block's sums in the scratch (weight row i, activation row r at
    i*rows+r)."""
    for i in range(weight_rows):
        for r in range(rows):
            out[b + r, column + i] = scratch[i * rows + r]


@njit(nogil=True)
def _f32_blocks(data, x, first, column, out, scratch, operands, calls, weight_rows=3):
    """out[:, column:column+weight_rows] = x @ data[first:first+weight_rows].T in AVX-512 blocks, then rows one
    by one: three weight rows in 3x8 blocks, then a 3x4; six in 6x4 blocks.

    ``operands``' strides, pass count, scratch and prefetch step are the caller's (the same for every block).
    """
    n = x.shape[0]
    b = 0
    call = 0
    while b + 4 <= n:
        rows = 8 if weight_rows == 3 and b + 8 <= n else 4
        _point_block(data, x, first, b, call, calls, operands, weight_rows)
        if weight_rows == 6:
            _f32_6x4(operands.ctypes.data)
        elif rows == 8:
            _f32_3x8(operands.ctypes.data)
        else:
            _f32_3x4(operands.ctypes.data)
        _reduce_block(scratch, rows, out, b, column, weight_rows)
        b += rows
        call += 1
    _rows_left(data, x, first, column, out, b, weight_rows)


@njit(nogil=True)
def _f32_blocks_avx2(data, x, first, column, out, sums, operands, calls):
    """out[:, column:column+3] = x @ data[first:first+3].T in AVX2 3x4 blocks, then rows one by one."""
    n = x.shape[0]
    b = 0
    call = 0
    while b + 4 <= n:
        _point_block(data, x, first, b, call, calls, operands)
        _f32_3x4_avx2(operands.ctypes.data)
        for i in range(3):
            for r in range(4):
                out[b + r, column + i] = sums[i, r]
        b += 4
        call += 1
    _rows_left(data, x, first, column, out, b)


@njit(nogil=True)
def _packed_blocks_avx2(data, scales, f16, run, x, first, column, out, sums, operands, calls, buf, keep, last, int8):
    """As _f32_blocks_avx2 for bf16 or (``int8``) int8 weight rows first.. first+3, of which rows keep..last go
    to out[:, column..] (int8's sums times their rows' scales); the activation rows the blocks leave take the
    rows expanded into ``buf`` (float32 [cols])."""
    n = x.shape[0]
    b = 0
    call = 0
    while b + 4 <= n:
        _point_block(data, x, first, b, call, calls, operands)
        if int8:
            _int8_3x4_avx2(operands.ctypes.data)
            for i in range(keep, last):
                s = scales[first + i, 0]
                for r in range(4):
                    out[b + r, column + i - keep] = sums[i, r] * s
        else:
            _bf16_3x4_avx2(operands.ctypes.data)
            for i in range(keep, last):
                for r in range(4):
                    out[b + r, column + i - keep] = sums[i, r]
        b += 4
        call += 1
    if b < n:
        for k in range(keep, last):
            if int8:
                row_int8(data[first + k], scales[first + k], f16, run, buf)
            else:
                row_bf16(data[first + k], scales[first + k], f16, run, buf)
            _dot_rows(buf, x, out, column + k - keep, b)


@njit(nogil=True)
def _point_block(data, x, first, b, call, calls, operands, weight_rows=3):
    """Aim a block's operands at weight rows first.. and activation rows b.., and at its share of the next rows."""
    row_bytes = operands[1]
    operands[0] = data.ctypes.data + first * row_bytes
    operands[2] = x.ctypes.data + b * operands[3]
    operands[6] = data.ctypes.data + (first + weight_rows) * row_bytes + call * (row_bytes // calls)


@njit(nogil=True, fastmath=True)
def _rows_left(data, x, first, column, out, b, weight_rows=3):
    """out[b:, column:column+weight_rows] = x[b:] @ data[first:first+weight_rows].T: the activation rows the blocks
    left."""
    if b < x.shape[0]:
        for k in range(weight_rows):
            _dot_rows(data[first + k], x, out, column + k, b)


@njit(nogil=True)
def _block_operands(x, row_bytes, lanes, scratch, calls):
    """A block's int64 [8] operands (:data:`_LOAD_OPERANDS`) with those the same for every block set."""
    operands = np.empty(8, np.int64)  # the blocks' drivers set 0, 2 and 6 (_point_block)
    operands[1] = row_bytes
    operands[3] = x.strides[0]
    operands[4] = x.shape[1] // lanes
    operands[5] = scratch.ctypes.data
    operands[7] = 4 * lanes // calls  # each of a block's calls prefetches its share of the next block's rows
    return operands


def product_f32_avx512(data, scales, f16, run, x, start, stop, out):
    # As product_f32, with the AVX-512 blocks where they apply: four rows up, columns a multiple of 16; the 6x4
    # block from WIDE_BLOCK_ROWS rows, six weight rows at a time, the 3x8 and 3x4 blocks for the rows left and
    # below WIDE_BLOCK_ROWS.
    n, cols = x.shape
    first = _f32_wide_blocks(data, x, start, stop, out)
    if n >= 4 and cols % 16 == 0:
        scratch = np.empty(24, np.float32)  # [3 weight rows x up to 8 activation rows]
        calls = n // 8 + (n % 8) // 4  # of the blocks, for each three weight rows
        operands = _block_operands(x, cols * 4, 16, scratch, calls)
        while first + 3 <= stop:
            _f32_blocks(data, x, first, first - start, out, scratch, operands, calls)
            first += 3
    _f32_rest(data, x, first, start, stop, out)


def product_f32_avx2(data, scales, f16, run, x, start, stop, out):
    # As product_f32, with the AVX2 3x4 block where it applies: four rows up, columns a multiple of 8.
    _f32_avx2_rows(data, x, start, start, stop, out)


@njit(nogil=True)
def _f32_avx2_rows(data, x, start, first, stop, out):
    """out[:, first-start:stop-start] = x @ data[first:stop].T in AVX2 3x4 blocks where they apply."""
    n, cols = x.shape
    if n >= 4 and cols % 8 == 0:
        sums = np.empty((3, 4), np.float32)  # [weight row, activation row] of one block
        operands = _block_operands(x, cols * 4, 8, sums, n // 4)
        while first + 3 <= stop:
            _f32_blocks_avx2(data, x, first, first - start, out, sums, operands, n // 4)
            first += 3
    _f32_rest(data, x, first, start, stop, out)


def product_f32_avx2_avx512(data, scales, f16, run, x, start, stop, out):
    # As product_f32_avx2 below WIDE_BLOCK_ROWS rows; from there, the AVX-512 6x4 block where columns are a
    # multiple of 16, six weight rows at a time (the rows left, as product_f32_avx2).
    first = _f32_wide_blocks(data, x, start, stop, out)
    _f32_avx2_rows(data, x, start, first, stop, out)


@njit(nogil=True)
def _f32_wide_blocks(data, x, start, stop, out):
    """out[:, :first-start] = x @ data[start:first].T in 6x4 zmm blocks from WIDE_BLOCK_ROWS activation rows and
    columns a multiple of 16; ``first``, the first weight row left (``start`` where the blocks do not apply)."""
    n, cols = x.shape
    first = start
    if n >= WIDE_BLOCK_ROWS and cols % 16 == 0:
        scratch = np.empty(24, np.float32)  # [6 weight rows x 4 activation rows]
        operands = _block_operands(x, cols * 4, 16, scratch, n // 4)
        while first + 6 <= stop:
            _f32_blocks(data, x, first, first - start, out, scratch, operands, n // 4, 6)
            first += 6
    return first


# Activation rows from which AVX-512 CPUs multiply float32 weights in the 6x4 zmm block (_f32_6x4): six weight
# rows by four activation rows, 24 sums, ten loads per 24 multiply-adds, each activation vector loaded once
# for six weight rows. With a dozen rows and more the products are bound by arithmetic rather than by the
# weights' bytes, and the ymm 3x4 block does half a zmm block's work per instruction: decode steps of
# Qwen3-0.6B's shapes ran 1.07x faster with it at 12 rows on Zen 5 (0.95x at 8), 1.24-1.29x on Zen 4, and
# 12 rows 80.7-84.8 tok/s against 75.1-81.4 with the 3x8 zmm block on an Intel Xeon (docs/notes/performance-log.md).
WIDE_BLOCK_ROWS = 12


def product_int8_avx2(data, scales, f16, run, x, start, stop, out):
    # As product_int8, with the AVX2 3x4 block of the quants (widened and converted in registers), each sum times
    # its row's scale once: _packed_avx2.
    _packed_avx2(data, scales, f16, run, x, start, stop, out, True)


def product_bf16_avx2(data, scales, f16, run, x, start, stop, out):
    # As product_bf16, with the AVX2 3x4 block of bf16 rows (widened in registers): _packed_avx2.
    _packed_avx2(data, scales, f16, run, x, start, stop, out, False)


@njit(nogil=True)
def _packed_avx2(data, scales, f16, run, x, start, stop, out, int8):
    """product_bf16_avx2's and product_int8_avx2's loops: the AVX2 3x4 block from four rows up, columns a multiple
    of 8, else the form's own loops.

    The one or two weight rows left take a block too, of three rows of the matrix that hold them (keeping only
    theirs): a row's sums do not depend on its block's other rows, so a row gets the same bits whatever stretch
    of the matrix a thread was given (the loops' sums would round differently).
    """
    n, cols = x.shape
    first = start  # rows from here on are the form's own loops'
    if n >= 4 and cols % 8 == 0:
        item = 1 if int8 else 2  # bytes a weight
        sums = np.empty((3, 4), np.float32)  # [weight row, activation row] of one block
        operands = _block_operands(x, cols * item, 8, sums, n // 4)
        operands[7] = 8 * item // (n // 4)  # bytes of each row a pass reads: each call prefetches its share
        buf = np.empty(cols, np.float32)  # [cols]
        while first + 3 <= stop:
            _packed_blocks_avx2(data, scales, f16, run, x, first, first - start, out, sums, operands, n // 4, buf,
                                0, 3, int8)
            first += 3
        if first < stop and data.shape[0] >= 3:  # the rows left, in a block of the matrix's that holds them
            block = min(first, data.shape[0] - 3)
            _packed_blocks_avx2(data, scales, f16, run, x, block, first - start, out, sums, operands, n // 4, buf,
                                first - block, stop - block, int8)
            first = stop
    if first < stop:
        if int8:
            _int8_rows(data, scales, f16, run, x, first, stop, out[:, first - start :])
        else:
            _bf16_rows(data, scales, f16, run, x, first, stop, out[:, first - start :])
