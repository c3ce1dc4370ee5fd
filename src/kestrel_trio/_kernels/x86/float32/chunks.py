"""Float32 products of prefill chunks on Intel CPUs with AVX-512: ``out [M, N] = x [M, K] @ w [N, K].T``.

Theory of operation: a prefill chunk's products are bound by multiply-adds.
BLAS's sgemm ran them at 52-62% of the 2-core Xeon's float32 peak at 128
rows (255-296 of 476-492 GFLOP/s), packing every weight block before using it
a few hundred times. This kernel packs the activations instead, which are
small, and reads the weights as they are stored:

1. :func:`pack` lays 32 activation rows side by side for each k,
   ``[M/32, K, 32]``, so that one k of a block is 128 contiguous bytes.
2. A register block holds 14 weight rows x 32 activation rows: 28 zmm sums.
   For each k, two vector loads of the packed activations, 14 broadcasts of
   ``w[n, k]`` (each weight row read along K, as stored), 28 multiply-adds
   (:func:`_block_text`).
3. :func:`product` runs GROUP blocks of activation rows at a time through
   every 14-row block of the weight rows it is given, over K in chunks of
   K_CHUNK (each chunk after the first added to ``out``).
4. A block's sums go to a 1.75 KiB staging buffer, and from there into the
   rows of ``out``: for each activation row a gather of its 14 sums (from
   L1) and one masked store. Scattering the 28 sums straight into ``out``'s
   rows instead ran at 171-177 GFLOP/s against 212-217 (one thread, 128 rows).
5. :func:`packed_product` keeps the output packed instead, [M/32, N, 32]:
   a block's 32 sums of weight row n are two whole stores at out[b, n]
   (:func:`_row_text`), and out is the next product's packed input
   (kestrel_trio._kernels.x86.float32.packed_rows). The 28 layers' four products of a
   256-row chunk, two threads: 351-368 GFLOP/s against 322-342 by
   :func:`product` with its packing (alternated in one process).

Measured on the 2-core Xeon with AMX (Qwen3-0.6B's layer
shapes): one thread 208-217 GFLOP/s at 128 rows, 88% of a core's float32
peak; two threads, the 28 layers' products in turn, 323-325 GFLOP/s against
BLAS's 255-260 at 128 rows, 318-326 against 304-312 at 256, 316-317 against
340-341 at 512 (kestrel_trio._model.products.matmul takes it up to 256 rows). The
sums are float32, each output's over K in order within a chunk: the error
against a float64 product is at most 1.5e-6 of the largest value on those
shapes (BLAS's: 4-7e-7).

Zen 4 and Zen 5 (AVX-512 too) keep BLAS: not measured there. Shapes: K a
multiple of 4; the weight rows given a multiple of 14, the activations
packed in blocks of 32 rows (kestrel_trio._kernels.chunk_product fills the
last block out with zero rows, and multiplies the weight rows past the
blocks with numpy).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from kestrel_trio._kernels.x86.float32.assembly import _ZMM, _asm_codegen

__all__ = ["pack", "product", "packed_product", "WEIGHT_ROWS", "ACTIVATION_ROWS", "K_STEP", "GROUP", "PACKED_GROUP"]

WEIGHT_ROWS = 14  # a register block's weight rows, each broadcast into two sums
ACTIVATION_ROWS = 32  # a register block's activation rows: two zmm vectors of the packed activations
K_STEP = 4  # k steps an iteration of the kernel's loop: K must be a multiple
GROUP = 2  # blocks of activation rows that go through the weights together (one thread: 208-217 against 190)
PACKED_GROUP = 4  # the same for :func:`packed_product` (a thread's 4 blocks of a 256-row chunk: 344-361 GFLOP/s
# against 339-349 at 2, two threads, the 28 layers' distinct weights)
K_CHUNK = 1024  # k a pass, each chunk's sums added to out: all of K in one sum had 2-5x BLAS's error, chunks of
# 512 ran a fifth slower on one thread (169-179 GFLOP/s against 208-217 at 128 rows)
PREFETCH = 1024  # bytes ahead the packed activations are asked into L1
OPERANDS = 13  # the kernels' int64 operands (see :func:`_block_text`)

# Weight row i at these addresses (r8, r13, r14, r15: rows 0, 4, 8, 12; r9: the rows' stride; r12: three strides).
_ROWS = ["(%r8)", "(%r8,%r9,1)", "(%r8,%r9,2)", "(%r8,%r12,1)", "(%r13)", "(%r13,%r9,1)", "(%r13,%r9,2)",
         "(%r13,%r12,1)", "(%r14)", "(%r14,%r9,1)", "(%r14,%r9,2)", "(%r14,%r12,1)", "(%r15)", "(%r15,%r9,1)"]
_CLOBBERED = _ZMM + ["zmm31", "r15", "rbx", "k1", "k2"]


def _block_text(add: bool) -> str:
    """Blocks of 32 activation rows times 14 weight rows over one chunk of K, into ``out``.

    Operands at $0, int64 [OPERANDS]: 0 weight row 0 at the chunk's first k; 1 the weight rows' stride (bytes);
    2 the packed activations' first block at the chunk's first k; 3 scratch (the block being read); 4 the
    chunk's k count (a multiple of K_STEP); 5 out[first activation row, first weight row]; 6 out's row stride
    (bytes); 7 blocks of activation rows; 9 the packed blocks' stride (bytes); 10 the staging buffer, float32
    [14, 32]; 11 the gather's offsets, int32 [16] (row i of the staging at lane i); 12 scratch (the chunk's
    bytes a row, for the prefetch of the next 14 rows: :func:`_blocks_loop`). ``add``: add to out, not store.
    """
    lines = ["mov 88($0), %rax", "vmovdqu32 (%rax), %zmm31", f"mov $${(1 << WEIGHT_ROWS) - 1}, %eax", "kmovw %eax, %k2"]
    lines += _blocks_loop(True, ["mov 80($0), %rdx"] + [f"vmovups {s}, {64 * a}(%rdx)" for a, s in enumerate(_SUMS)]
                          + ["mov %rsi, %r13"] + _gathered_rows(add) + ["mov %r13, %rsi"])
    return "\n".join(lines)


def _gathered_rows(add: bool) -> list[str]:
    """The staged sums into out's 32 rows from r13 on: each activation row's 14 sums, a gather and a masked store."""
    lines = []
    for r in range(ACTIVATION_ROWS):
        lines += ["kmovw %k2, %k1", f"vgatherdps {4 * r}(%rdx,%zmm31,1), %zmm0 {{%k1}}"]
        if add:
            lines += ["vmovups (%r13), %zmm1 {%k2} {z}", "vaddps %zmm1, %zmm0, %zmm0"]
        lines += ["vmovups %zmm0, (%r13) {%k2}", "add %rdi, %r13"]
    return lines


def _row_text(add: bool = False, next_rows: bool = True) -> str:
    """:func:`_block_text` with out's rows the weight rows: ``out[n, m] = w[n] . activation m``, stored (``add``:
    added to what out holds).

    Operands as :func:`_block_text`'s, but 5 is out[first weight row, first activation row], 8 the bytes from one
    block's sums in out to the next's (128 where out is [N, M], out's stride where it is packed [M/32, N, 32]), and
    neither staging nor offsets is read: a block's sums for weight row i are out[i]'s 32 floats, two stores.
    ``next_rows``: prefetch the next 14 weight rows (:func:`_blocks_loop`); not for attention's products, whose
    weight rows, queries or scores, are in L2 already.
    """
    stores = ["mov %rsi, %r13"]
    for i in range(WEIGHT_ROWS):
        for half, s in enumerate(_SUMS[2 * i : 2 * i + 2]):
            stores += [f"vaddps {64 * half}(%r13), {s}, {s}"] if add else []
            stores.append(f"vmovups {s}, {64 * half}(%r13)")
        stores.append("add %rdi, %r13")
    return "\n".join(_blocks_loop(next_rows, stores + ["add 64($0), %rsi"]))


# The 28 sums of a register block: weight row i's activation rows 0-15 at 2i, 16-31 at 2i+1.
_SUMS = [f"%zmm{a}" for a in range(2 * WEIGHT_ROWS)]


def _blocks_loop(next_rows: bool, store: list[str]) -> list[str]:
    """The loop over operand 7's blocks of activation rows, each through the k loop; ``store`` then writes its
    sums, out's current address in rsi (which it moves on to the next block's) and out's row stride in rdi.

    ``next_rows``: each k iteration also asks one 64-byte line of the next 14 weight rows' chunk into L2 (rbx the
    row, r11 the byte in it, operand 12 the chunk's bytes a row), so that the next call finds them there, not in
    memory: a pass over new weight rows is the only one of a group's that reads memory, and spread over all of
    them the reads cost less (the 28 layers' products of a 256-token chunk, two threads, alternated ten times:
    median 367 GFLOP/s against 359, faster in 9 of 10; two or four lines an iteration were slower; whole
    512-token prefills alternated 8 times in one process: 1360-1434 ms against 1378-1441, faster in 7).
    """
    lines = ["mov 8($0), %r9", "lea (%r9,%r9,2), %r12", "mov 48($0), %rdi", "mov 40($0), %rsi", "mov 56($0), %rax",
             "mov 16($0), %rdx", "mov %rdx, 24($0)"]
    if next_rows:  # rbx: weight row 14 at the chunk's first k; operand 12: the chunk's bytes a row
        lines += ["mov 32($0), %rdx", "shl $$2, %rdx", "mov %rdx, 96($0)", "imul $$14, %r9, %rbx", "add 0($0), %rbx",
                  "xor %r11d, %r11d"]
    lines += ["2:", "mov 0($0), %r8", "lea (%r8,%r9,4), %r13", "lea (%r13,%r9,4), %r14", "lea (%r14,%r9,4), %r15",
              "mov 24($0), %r10", "mov 32($0), %rcx", "shr $$2, %rcx"]
    lines += [f"vpxord {s}, {s}, {s}" for s in _SUMS]
    lines.append("1:")
    for u in range(K_STEP):
        at = 4 * ACTIVATION_ROWS * u
        lines += [f"vmovups {at}(%r10), %zmm28", f"vmovups {at + 64}(%r10), %zmm29",
                  f"prefetcht0 {PREFETCH + at}(%r10)", f"prefetcht0 {PREFETCH + at + 64}(%r10)"]
        for i, row in enumerate(_ROWS):
            lines += [f"vbroadcastss {4 * u if u else ''}{row}, %zmm30", f"vfmadd231ps %zmm28, %zmm30, {_SUMS[2 * i]}",
                      f"vfmadd231ps %zmm29, %zmm30, {_SUMS[2 * i + 1]}"]
    if next_rows:  # the next line of the next rows; past a row's chunk, the next row's
        lines += ["prefetcht1 (%rbx,%r11)", "add $$64, %r11", "cmp 96($0), %r11", "jb 3f", "xor %r11d, %r11d",
                  "add %r9, %rbx", "3:"]
    lines += [f"add $${4 * K_STEP}, %{r}" for r in ("r8", "r13", "r14", "r15")]
    lines += [f"add $${4 * ACTIVATION_ROWS * K_STEP}, %r10", "dec %rcx", "jnz 1b"]
    lines += store
    lines += ["mov 72($0), %rdx", "add %rdx, 24($0)", "dec %rax", "jnz 2b", "vzeroupper"]
    return lines


@intrinsic
def _store_blocks(typingctx, operands):
    """:func:`_block_text`, storing; ``operands``: the address of its int64 [OPERANDS] operands."""
    return types.void(types.int64), _asm_codegen(_block_text(False), _CLOBBERED)


@intrinsic
def _add_blocks(typingctx, operands):
    """:func:`_block_text`, adding to out; ``operands``: the address of its int64 [OPERANDS] operands."""
    return types.void(types.int64), _asm_codegen(_block_text(True), _CLOBBERED)


@intrinsic
def _store_packed(typingctx, operands):
    """:func:`_row_text`, storing; ``operands``: the address of its int64 [OPERANDS] operands."""
    return types.void(types.int64), _asm_codegen(_row_text(False), _CLOBBERED)


@intrinsic
def _add_packed(typingctx, operands):
    """:func:`_row_text`, adding to out; ``operands``: the address of its int64 [OPERANDS] operands."""
    return types.void(types.int64), _asm_codegen(_row_text(True), _CLOBBERED)


def pack(x: np.ndarray, rows: int) -> np.ndarray:
    """The first ``rows`` rows of ``x`` float32 [M, K] (zero rows past M; ``rows`` a multiple of 32) as
    :func:`product` reads them: [rows/32, K, 32], C-contiguous."""
    m, k = x.shape
    packed = np.empty((rows // ACTIVATION_ROWS, k, ACTIVATION_ROWS), dtype=np.float32)  # [blocks, K, 32]
    whole = min(m, rows) // ACTIVATION_ROWS
    packed[:whole] = x[: whole * ACTIVATION_ROWS].reshape(whole, ACTIVATION_ROWS, k).transpose(0, 2, 1)
    if whole < packed.shape[0]:
        part = x[whole * ACTIVATION_ROWS : rows]  # [< 32, K]
        packed[whole] = 0
        packed[whole, :, : part.shape[0]] = part.T
    return packed


@njit(nogil=True, cache=True)
def product(w, packed, out, start, stop):
    """out[:M, start:stop] = the packed activations (M rows) @ w[start:stop].T; stop - start a multiple of 14.

    ``w`` float32 [N, K] and ``out`` float32 [>= M, N], each with unit column stride, any row stride.
    """
    staging = np.empty(2 * WEIGHT_ROWS * 16, np.float32)  # [14, 32]: weight row, activation row
    offsets = (np.arange(16) * (4 * ACTIVATION_ROWS)).astype(np.int32)  # [16]: staging row i at lane i
    # Passed on, not used here by address: numba frees an array after its last use in the code, and taking
    # ``.ctypes.data`` is that last use; the assembly then wrote into freed memory (glibc: "malloc(): invalid
    # size" in another allocation). The arguments of a call stay alive until it returns.
    _product(w, packed, out, start, stop, staging, offsets)


@njit(nogil=True, cache=True)
def _product(w, packed, out, start, stop, staging, offsets):
    """:func:`product` with its staging buffer and gather offsets, which the caller keeps alive."""
    blocks, k, _ = packed.shape  # [M/32, K, 32]
    operands = np.zeros(OPERANDS, np.int64)
    operands[1], operands[6], operands[9] = w.strides[0], out.strides[0], packed.strides[0]
    operands[10], operands[11] = staging.ctypes.data, offsets.ctypes.data
    for g in range(0, blocks, GROUP):
        operands[7] = min(GROUP, blocks - g)
        for k0 in range(0, k, K_CHUNK):  # chunk outermost: each weight row block streams through once a chunk
            for first in range(start, stop, WEIGHT_ROWS):
                operands[0] = w.ctypes.data + first * w.strides[0] + 4 * k0
                operands[2] = packed.ctypes.data + g * packed.strides[0] + 4 * ACTIVATION_ROWS * k0
                operands[4] = min(K_CHUNK, k - k0)
                operands[5] = out.ctypes.data + g * ACTIVATION_ROWS * out.strides[0] + 4 * first
                if k0 == 0:
                    _store_blocks(operands.ctypes.data)
                else:
                    _add_blocks(operands.ctypes.data)


@njit(nogil=True, cache=True)
def packed_product(w, packed, out, first, stop):
    """out[b, :R] = w[:R] @ packed[b] for the blocks b in [first, stop): the product packed as its input is.

    ``packed`` float32 [B, K, 32] (:func:`pack`'s layout) and ``out`` float32 [B, >= R, 32], both C-contiguous;
    ``w`` float32 [>= R, K] with unit column stride, R its rows rounded down to a multiple of 14 (the caller
    multiplies the rows past them). By :func:`_row_text`: no staging, no gather, each weight row's 32 sums of a
    block two stores into out[b, row].
    """
    _packed_product(w, packed, out, first, stop, np.zeros(OPERANDS, np.int64))


@njit(nogil=True, cache=True)
def _packed_product(w, packed, out, first, stop, operands):
    """:func:`packed_product` with its operands, which the caller keeps alive while the assembly reads them."""
    k = packed.shape[1]
    rows = w.shape[0] - w.shape[0] % WEIGHT_ROWS
    operands[1], operands[6], operands[8], operands[9] = w.strides[0], out.strides[1], out.strides[0], packed.strides[0]
    for g in range(first, stop, PACKED_GROUP):
        operands[7] = min(PACKED_GROUP, stop - g)
        for k0 in range(0, k, K_CHUNK):  # chunk outermost: each weight row block streams through once a chunk
            operands[2] = packed.ctypes.data + g * packed.strides[0] + 4 * ACTIVATION_ROWS * k0
            operands[4] = min(K_CHUNK, k - k0)
            for r in range(0, rows, WEIGHT_ROWS):
                operands[0] = w.ctypes.data + r * w.strides[0] + 4 * k0
                operands[5] = out.ctypes.data + g * out.strides[0] + r * out.strides[1]
                if k0 == 0:
                    _store_packed(operands.ctypes.data)
                else:
                    _add_packed(operands.ctypes.data)
