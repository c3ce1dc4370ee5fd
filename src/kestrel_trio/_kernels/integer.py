"""Integer dot products of Q8_0 weights with activations quantized to Q8_0: the portable reference loops.

Theory of operation: today's products expand every quantized weight to
float32 and multiply in float32, so a decode step costs about three aarch64
instructions a weight (benchmarks/board_speed.py) where llama.cpp, reading
the same bytes, spends a fifth of one: it quantizes each activation row once,
per block of 32, to int8 with one float32 scale (``d_x = max|x| / 127``,
``q_x = x / d_x`` rounded to nearest, ties to even, as ggml's NEON and AVX
paths round), and takes each block's product as ``d_w * d_x * sum(q_w * q_x)``:
an int32 sum of 32 int8 products. LLVM compiles that sum, written as a plain
loop whose trip count is a run-time value (``run``, 32), to ``sdot`` on an
aarch64 CPU with the dot-product extension (Cortex-A76, A55: four int32 lanes
of four int8 products each, two instructions a block) and to widening
multiplies without it (Cortex-A53) or on x86-64 (``vpmaddwd``); with a
constant 32 it unrolls the loop into scalar code instead (measured under
qemu, numba 0.68: no ``sdot``). The integer sum is exact whatever the order,
and the blocks' float32 terms are added in order (no fastmath), so these
loops are bit-exact against the numpy reference in the tests on every CPU.

The results differ from the exact float32 product by the activations'
rounding (a relative error of about 1/254 per activation, which averages
down over a row); llama.cpp's quantized products differ the same way. Not
used by the model yet: the integer path becomes a form's product once its
fidelity on every fixture is measured (the integer-products issue).

Weights are the GGUF rows as stored, uint8 [rows, blocks * 34] (float16 ``d``
then 32 int8 ``q`` a block), read in place. The float16 lookup and the int8
from a stored byte are written out here, not called from products.py (its
``_half`` and ``_q8_signed``): numba invalidates a cached function when its
own file changes, not when a function it calls from another file does.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["quantize_q8_rows", "product_q8_0"]


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
def product_q8_0(data, f16, run, xq, xd, start, stop, out):
    """``out`` [N, stop-start] = the quantized rows ``xq``/``xd`` [N, ...] (quantize_q8_rows) @ Q8_0 rows
    ``data`` [start:stop].T: per block, four int32 lane sums (lane j: bytes 4j..4j+3 and 16+4j..16+4j+3, as
    two ``sdot`` group them), each accumulated as ``acc[j] = fma(float32(lane), d_w * d_x, acc[j])``; the row's
    value ``(acc[0] + acc[1]) + (acc[2] + acc[3])``."""
    n = xq.shape[0]
    blocks = xq.shape[1] // run
    for r in range(start, stop):
        row = data[r]
        for b in range(n):
            quants = xq[b]
            acc = np.zeros(4, dtype=np.float32)
            for block in range(blocks):
                at = 34 * block
                scale = f16[np.int32(row[at]) | (np.int32(row[at + 1]) << 8)] * xd[b, block]
                for j in range(4):
                    lane = np.int32(0)
                    for half in range(2):
                        for i in range(16 * half + 4 * j, 16 * half + 4 * j + 4):
                            weight = (np.int32(row[at + 2 + i]) ^ np.int32(128)) - np.int32(128)
                            lane += weight * np.int32(quants[block * run + i])
                    acc[j] = _fma(np.float32(lane), scale, acc[j])
            out[b, r - start] = (acc[0] + acc[1]) + (acc[2] + acc[3])
