"""Q8_0 x Q8_0 block dot products for aarch64 NEON: ``sdot`` where the CPU has dotprod, widening multiplies where not.

Theory of operation: each Q8_0 block's product is ``d_w * d_x * (the int8
products of its 32 weights and 32 quantized activations)``. The portable
reference (``_kernels.integer.product_q8_0``) fixes the arithmetic; this file
emits it as LLVM vector IR (numba ``intrinsic``s), since numba's loops over a
fixed 32-block unroll into scalar code. A block, for one weight row:

- its 32 products summed into four int32 lanes, lane ``j`` holding bytes
  ``4j..4j+3`` and ``16+4j..16+4j+3``: two ``sdot`` (``llvm.aarch64.neon.sdot``;
  ARMv8.2-A dotprod: Cortex-A76, A55), or without dotprod the same lane sums from
  sign-extended bytes (generic IR that LLVM lowers to ``smull``/``sadalp`` on
  NEON, to ``vpmaddwd`` on x86-64);
- the lanes converted to float32 and accumulated as ``acc = fma(lanes, d_w *
  d_x, acc)``: four float32 lanes a row, no across-lanes add per block;
- at the row's end ``(acc0 + acc1) + (acc2 + acc3)``.

Rows go four at a time, sharing the activation loads and the loop. Integer sums
are exact, and every float32 step is the reference's in its order, so each
variant equals the reference bit for bit. A weight's float16 scale is
converted by the CPU (``fcvt``), which equals the reference's table on every
finite and infinite value.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["product_q8_0_sdot", "product_q8_0_widening"]

_I8x16 = ir.VectorType(ir.IntType(8), 16)
_I32x4 = ir.VectorType(ir.IntType(32), 4)
_I32x16 = ir.VectorType(ir.IntType(32), 16)
_F32 = ir.FloatType()
_F32x4 = ir.VectorType(_F32, 4)
_I64 = ir.IntType(64)
_ROWS = 4  # weight rows a pass


def _lanes_sdot(builder, w0, w1, x0, x1):
    """A block's int32 lane sums by two ``sdot``."""
    sdot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32x4, [_I32x4, _I8x16, _I8x16]),
                                          "llvm.aarch64.neon.sdot.v4i32.v16i8")
    lanes = builder.call(sdot, [ir.Constant(_I32x4, None), w0, x0])  # [4] int32
    return builder.call(sdot, [lanes, w1, x1])  # [4] int32


def _lanes_widening(builder, w0, w1, x0, x1):
    """The same lane sums without dotprod: bytes sign-extended, multiplied, each lane's four added."""
    products = builder.add(builder.mul(builder.sext(w0, _I32x16), builder.sext(x0, _I32x16)),
                           builder.mul(builder.sext(w1, _I32x16), builder.sext(x1, _I32x16)))  # [16] int32
    parts = [builder.shuffle_vector(products, products, ir.Constant(_I32x4, [i, 4 + i, 8 + i, 12 + i]))
             for i in range(4)]  # [4] int32 each: the i-th byte of every lane's group
    return builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))


def _load16(builder, base, offset):
    """16 bytes at ``base + offset`` (bytes) as an int8x16 vector, any alignment."""
    return builder.load(builder.bitcast(builder.gep(base, [offset]), _I8x16.as_pointer()), align=1)


def _rows_dot(lanes_of, rows: int):
    """An intrinsic ``(data, r, xq, xd, out, b, column) -> None``: Q8_0 rows ``data[r : r + rows]`` (uint8
    [rows, blocks * 34], C order) against quantized activation row ``b`` (``xq`` int8 [N, blocks * 32], ``xd``
    float32 [N, blocks]), into ``out[b, column : column + rows]``."""

    @intrinsic
    def rows_dot(typingctx, data, r, xq, xd, out, b, column):
        def codegen(context, builder, signature, args):
            data_t, _, xq_t, xd_t, out_t, _, _ = signature.args
            data_a = context.make_array(data_t)(context, builder, args[0])
            xq_a = context.make_array(xq_t)(context, builder, args[2])
            xd_a = context.make_array(xd_t)(context, builder, args[3])
            out_a = context.make_array(out_t)(context, builder, args[4])
            r, b, column = (context.cast(builder, v, t, types.intp) for v, t in
                            ((args[1], signature.args[1]), (args[5], signature.args[5]), (args[6], signature.args[6])))
            zero = ir.Constant(_I64, 0)
            row_ptrs = [cgutils.get_item_pointer2(context, builder, data_a.data, cgutils.unpack_tuple(
                builder, data_a.shape, 2), cgutils.unpack_tuple(builder, data_a.strides, 2), "C",
                [builder.add(r, ir.Constant(_I64, i)), zero]) for i in range(rows)]  # uint8* each
            x_ptr = cgutils.get_item_pointer(context, builder, xq_t, xq_a, [b, zero])  # int8*
            d_ptr = cgutils.get_item_pointer(context, builder, xd_t, xd_a, [b, zero])  # float*
            blocks = builder.sdiv(builder.extract_value(xq_a.shape, 1), ir.Constant(_I64, 32))
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32x4, [_F32x4] * 3),
                                                 "llvm.fma.v4f32")
            accs = [cgutils.alloca_once_value(builder, ir.Constant(_F32x4, None)) for _ in range(rows)]
            with cgutils.for_range(builder, blocks) as loop:
                k = loop.index
                x_at = builder.gep(x_ptr, [builder.mul(k, ir.Constant(_I64, 32))])
                x0, x1 = _load16(builder, x_at, zero), _load16(builder, x_at, ir.Constant(_I64, 16))
                d_x = builder.load(builder.gep(d_ptr, [k]))
                w_off = builder.mul(k, ir.Constant(_I64, 34))
                for row_ptr, acc in zip(row_ptrs, accs):
                    at = builder.gep(row_ptr, [w_off])  # the block's 34 bytes: float16 d, 32 int8 q
                    d_w = builder.fpext(builder.load(builder.bitcast(at, ir.HalfType().as_pointer()), align=1), _F32)
                    w0 = _load16(builder, at, ir.Constant(_I64, 2))
                    w1 = _load16(builder, at, ir.Constant(_I64, 18))
                    scale = builder.fmul(d_w, d_x)
                    splat = builder.shuffle_vector(builder.insert_element(ir.Constant(_F32x4, None), scale, zero),
                                                   ir.Constant(_F32x4, None), ir.Constant(_I32x4, [0] * 4))
                    lanes = builder.sitofp(lanes_of(builder, w0, w1, x0, x1), _F32x4)  # [4] float32
                    builder.store(builder.call(fma, [lanes, splat, builder.load(acc)]), acc)
            for i, acc in enumerate(accs):
                a = builder.load(acc)
                parts = [builder.extract_element(a, ir.Constant(ir.IntType(32), j)) for j in range(4)]
                total = builder.fadd(builder.fadd(parts[0], parts[1]), builder.fadd(parts[2], parts[3]))
                builder.store(total, cgutils.get_item_pointer(
                    context, builder, out_t, out_a, [b, builder.add(column, ir.Constant(_I64, i))]))
            return context.get_dummy_value()

        if not (isinstance(data, types.Array) and data.ndim == 2 and data.layout == "C" and data.dtype == types.uint8):
            return None
        if not (isinstance(xq, types.Array) and xq.ndim == 2 and xq.layout == "C" and xq.dtype == types.int8):
            return None
        if not (isinstance(xd, types.Array) and xd.ndim == 2 and xd.layout == "C" and xd.dtype == types.float32):
            return None
        if not (isinstance(out, types.Array) and out.ndim == 2 and out.dtype == types.float32):
            return None
        return types.void(data, r, xq, xd, out, b, column), codegen

    return rows_dot


_four_sdot, _one_sdot = _rows_dot(_lanes_sdot, _ROWS), _rows_dot(_lanes_sdot, 1)
_four_widening, _one_widening = _rows_dot(_lanes_widening, _ROWS), _rows_dot(_lanes_widening, 1)


@njit(nogil=True, cache=True)
def product_q8_0_sdot(data, xq, xd, start, stop, out):
    """``out`` [N, stop-start] = the quantized activations ``xq`` int8 [N, cols] / ``xd`` float32 [N, cols/32]
    @ Q8_0 rows ``data`` uint8 [start:stop, cols/32*34].T, by ``sdot`` (needs dotprod)."""
    r = start
    while r + 4 <= stop:
        for b in range(xq.shape[0]):
            _four_sdot(data, r, xq, xd, out, b, r - start)
        r += 4
    for last in range(r, stop):
        for b in range(xq.shape[0]):
            _one_sdot(data, last, xq, xd, out, b, last - start)


@njit(nogil=True, cache=True)
def product_q8_0_widening(data, xq, xd, start, stop, out):
    """As :func:`product_q8_0_sdot` without the dot-product extension (any NEON CPU; x86-64 too)."""
    r = start
    while r + 4 <= stop:
        for b in range(xq.shape[0]):
            _four_widening(data, r, xq, xd, out, b, r - start)
        r += 4
    for last in range(r, stop):
        for b in range(xq.shape[0]):
            _one_widening(data, last, xq, xd, out, b, last - start)
