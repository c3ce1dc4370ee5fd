"""bf16 tile products on CPUs with AMX (Intel Sapphire Rapids and later): float32 in and out, bf16 inside.

Theory of operation: a prefill chunk's products are bound by float32
multiply-adds (about 350 GFLOPS on the 2-core Xeon's two cores, measured
with OpenBLAS at 2048^3). AMX multiplies 16x32 bf16 tiles by 32x16 ones
into 16x16 float32 tiles, 16 times the multiply-adds of an AVX-512 FMA a
cycle. numba has no AMX, so the kernel is a few instructions of inline
assembly (LLVM assembles them; ``llvmlite.binding.initialize_native_asmparser``).

``out [M, N] = x [M, K] @ w [N, K].T`` is computed transposed, ``C^T = w .
x^T``: AMX wants its second operand in pairs of rows ("VNNI" layout), and
packing the activations (a chunk's few hundred rows) costs far less than
packing the weights. So:

1. :func:`pack_rows` rounds ``x`` to bf16 (nearest even) and packs it into
   tiles of 16 rows (the rows of C^T's columns), ``[m_tiles, k_tiles, 16, 16, 2]``.
2. For each block of 32 weight rows, :func:`product` rounds them to bf16 into
   a small buffer (the weights stay float32 in memory; :func:`product_bits`
   reads bf16 weights, the bf16 residency's, where they are), then runs 2x2
   output tiles (tmm0-3) from two weight tiles (tmm4-5) and two activation
   tiles (tmm6-7) along K, stores C^T's 32 rows into a scratch, and
   transposes the scratch into ``out``'s 32 columns.

Rounding both operands to bf16 is the whole difference from a float32
product: each product of two bf16 values is exact in float32 and the sums
are float32, so the result equals ``bf16(x) @ bf16(w).T`` in float32 up to
summation order. That is a different rounding than kestrel's float32
products (relative error about 2^-8 per weight): kestrel uses these tiles
only when asked (``prefill_precision="bf16"``).

Linux lets a process use AMX's tile registers only after asking
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); :func:`enable`
asks, and says why when it cannot. Each call configures the tiles of its own
thread (the state is per thread) and releases them at the end.

Shapes: K a multiple of 32, and the weight rows a thread takes a multiple of
32; kestrel_trio._model.products.matmul falls back to float32 products otherwise.
"""

from __future__ import annotations

import ctypes
import os

import llvmlite.binding as llvm_binding
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["enable", "pack_rows", "product", "product_bits", "TILE_ROWS", "BLOCK_ROWS", "K_STEP"]

TILE_ROWS = 16  # rows of a tile
BLOCK_ROWS = 32  # weight rows a block: two tiles
K_STEP = 32  # bf16 values along K a tile holds (64 bytes a row)

llvm_binding.initialize_native_asmparser()  # the kernel is inline assembly

_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158  # x86_64

# C^T's 2x2 tiles: tmm0 (rows n0, cols m0), tmm1 (n0, m1), tmm2 (n1, m0), tmm3 (n1, m1), from the weight
# tiles tmm4 (n0), tmm5 (n1) and the activation tiles tmm6 (m0), tmm7 (m1), along K, then stored.
# Operands: $0 weight block (bf16 rows), $1 its row stride (bytes), $2 activation tiles m0, $3 m1,
# $4 K steps, $5 where C^T's tile (n0, m0) goes, $6 C^T's row stride (bytes).
_TILES_2X2 = """
mov $0, %r8
mov $1, %r9
shl $$4, %r9
add $0, %r9
mov $2, %r10
mov $3, %r11
mov $4, %rcx
mov $$64, %rdx
tilezero %tmm0
tilezero %tmm1
tilezero %tmm2
tilezero %tmm3
1:
tileloadd (%r8,$1,1), %tmm4
tileloadd (%r9,$1,1), %tmm5
tileloadd (%r10,%rdx,1), %tmm6
tileloadd (%r11,%rdx,1), %tmm7
tdpbf16ps %tmm6, %tmm4, %tmm0
tdpbf16ps %tmm7, %tmm4, %tmm1
tdpbf16ps %tmm6, %tmm5, %tmm2
tdpbf16ps %tmm7, %tmm5, %tmm3
add $$64, %r8
add $$64, %r9
add $$1024, %r10
add $$1024, %r11
dec %rcx
jnz 1b
mov $5, %r8
tilestored %tmm0, (%r8,$6,1)
tilestored %tmm1, 64(%r8,$6,1)
mov $6, %r9
shl $$4, %r9
add %r9, %r8
tilestored %tmm2, (%r8,$6,1)
tilestored %tmm3, 64(%r8,$6,1)
"""
_CLOBBERS = "~{r8},~{r9},~{r10},~{r11},~{rcx},~{rdx},~{memory},~{cc},~{dirflag},~{fpsr},~{flags}"


def _asm_call(builder, text: str, constraints: str, args: list) -> None:
    i64 = ir.IntType(64)
    asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i64] * len(args)), text, constraints, side_effect=True)
    builder.call(asm, args)


@intrinsic
def _tiles_2x2(typingctx, w, ldw, x0, x1, steps, c, ldc):
    def codegen(context, builder, signature, args):
        _asm_call(builder, _TILES_2X2, "r,r,r,r,r,r,r," + _CLOBBERS, list(args))
        return context.get_dummy_value()
    return types.void(*([types.int64] * 7)), codegen


@intrinsic
def _load_config(typingctx, config):
    def codegen(context, builder, signature, args):
        _asm_call(builder, "ldtilecfg ($0)", "r,~{memory}", list(args))
        return context.get_dummy_value()
    return types.void(types.int64), codegen


@intrinsic
def _release(typingctx):
    def codegen(context, builder, signature, args):
        _asm_call(builder, "tilerelease", "~{memory}", [])
        return context.get_dummy_value()
    return types.void(), codegen


def _config() -> np.ndarray:
    """The 64-byte tile configuration: palette 1, all eight tiles 16 rows of 64 bytes."""
    config = np.zeros(64, dtype=np.uint8)
    config[0] = 1
    config[16:32].view(np.uint16)[:] = 64  # bytes per row, tmm0-7
    config[48:56] = TILE_ROWS  # rows, tmm0-7
    return config


CONFIG = _config()


@njit(nogil=True, cache=True)
def _to_bf16(bits):
    """float32 bits (uint32) -> bf16 bits, rounded to nearest even (finite values)."""
    return np.uint16((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@njit(nogil=True, cache=True)
def pack_rows(x, packed):
    """``x`` float32 [M, K] -> bf16 tiles ``packed`` uint16 [m_tiles, K/32, 16, 16, 2] (rows past M: zero)."""
    m, k = x.shape
    bits = x.view(np.uint32)
    m_tiles, k_tiles = packed.shape[0], packed.shape[1]
    for mt in range(m_tiles):
        for kt in range(k_tiles):
            for pair in range(16):
                col = kt * K_STEP + 2 * pair
                for r in range(16):
                    row = mt * 16 + r
                    if row < m:
                        packed[mt, kt, pair, r, 0] = _to_bf16(bits[row, col])
                        packed[mt, kt, pair, r, 1] = _to_bf16(bits[row, col + 1])
                    else:
                        packed[mt, kt, pair, r, 0] = 0
                        packed[mt, kt, pair, r, 1] = 0


@njit(nogil=True, cache=True)
def product(packed, m, w, start, stop, out, config):
    """``out[:, start:stop] = bf16(x) @ bf16(w[start:stop]).T`` from :func:`pack_rows`'s ``packed`` of x's ``m`` rows.

    ``w``: float32 [N, K], rounded to bf16 a block of 32 rows at a time;
    ``stop - start`` a multiple of 32; ``out``: float32 [m, >= stop].
    """
    k = w.shape[1]
    block = np.empty((BLOCK_ROWS, k), dtype=np.uint16)  # [32, K] the weights' bf16 bits
    scratch = np.empty((BLOCK_ROWS, packed.shape[0] * TILE_ROWS), dtype=np.float32)  # [32, m_tiles*16] C^T's rows
    wbits = w.view(np.uint32)
    _load_config(config.ctypes.data)
    for n0 in range(start, stop, BLOCK_ROWS):
        for r in range(BLOCK_ROWS):
            for j in range(k):
                block[r, j] = _to_bf16(wbits[n0 + r, j])
        _block_product(block.ctypes.data, k * 2, packed, m, scratch, out, n0)
    _release()


@njit(nogil=True, cache=True)
def product_bits(packed, m, bits, start, stop, out, config):
    """As :func:`product`, for weights already bf16: ``bits`` uint16 [N, K], C-contiguous, read in place."""
    k = bits.shape[1]
    scratch = np.empty((BLOCK_ROWS, packed.shape[0] * TILE_ROWS), dtype=np.float32)  # [32, m_tiles*16] C^T's rows
    _load_config(config.ctypes.data)
    for n0 in range(start, stop, BLOCK_ROWS):
        _block_product(bits.ctypes.data + n0 * k * 2, k * 2, packed, m, scratch, out, n0)
    _release()


@njit(nogil=True, cache=True)
def _block_product(weights_at, row_bytes, packed, m, scratch, out, n0):
    """``out[:, n0:n0+32]`` from the 32 bf16 weight rows at address ``weights_at`` (``row_bytes`` apart).

    Every pair of activation tiles in 2x2 output tiles into ``scratch`` [32, m_tiles*16] (C^T's rows), then
    the scratch transposed into ``out``'s 32 columns. The tiles must be configured (:func:`_load_config`).
    """
    m_tiles, k_tiles = packed.shape[0], packed.shape[1]
    tile_bytes = k_tiles * 1024
    packed_at = packed.ctypes.data
    for mt in range(0, m_tiles, 2):
        _tiles_2x2(weights_at, row_bytes, packed_at + mt * tile_bytes, packed_at + (mt + 1) * tile_bytes, k_tiles,
                   scratch.ctypes.data + mt * 64, m_tiles * TILE_ROWS * 4)
    for row in range(m):
        for r in range(BLOCK_ROWS):
            out[row, n0 + r] = scratch[r, row]


def enable() -> str | None:
    """Ask Linux for the tile registers; None when this process may use them, else why not.

    Only for a CPU whose plan has the tiles (kestrel_trio._kernels.plan: x86-64 Linux with amx-tile and amx-bf16).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
        errno = ctypes.get_errno()
        return f"Linux refused the AMX tile state (arch_prctl: errno {errno}, {os.strerror(errno)})"
    return None
