"""Products with packed weights, each weight row expanded once into a small buffer and used while hot.

Theory of operation: a decode step with packed weights (bf16, int8, int4, a
GGUF's blocks) used to expand cache-sized chunks with numpy and multiply them
with BLAS. numpy has no mixed-precision kernel: its int8-to-float32 cast
alone cost about as much as the whole float32 product it was meant to beat
(0.18-0.21 ns a weight against 0.20). Here each row of weights is expanded
by its form's exact expander (kestrel_trio._kernels.rows) into a buffer of
one row (a few KiB, in L1) and multiplied at once with every activation row,
four at a time, so the weights are read from memory once, in their compact
form, and expanded once per step whatever the batch.

The dot products are compiled with fastmath (reassociation lets LLVM keep
vector accumulators), so they round differently from BLAS in the last bits;
the expanded weights themselves are exact (kestrel_trio._kernels.rows).

One product per storage form, each with one explicit signature, compiled
at its first use (:func:`product_for`) and cached on disk by numba (a later
process loads it in milliseconds). Any C-contiguous storage, writable or
mapped read-only, converts to the signature's read-only type, so no call
compiles another version. They are written out one by one, not made by a
factory or handed the expander as an argument: numba cannot cache either,
and a single product that dispatched on the form kept LLVM from fusing the
expansion with the dot product into one pass (measured, 1 row: int8 0.21
ns a weight that way, 0.17 per form; Q8_0 0.27 against 0.23).

The functions release the GIL (``nogil``): the product threads of
kestrel_trio._model.matmul run them on separate cores, each on its own
stretch of rows.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit, types

from kestrel_trio._kernels.rows import (
    row_bf16, row_f16, row_f32, row_int8, row_q4_0, row_q4_1, row_q4_k, row_q5_k, row_q6_k, row_q8_0,
)

__all__ = ["FORMS", "product_for", "COLUMNS_PER_ITEM"]


def _storage(dtype) -> types.Array:
    return types.Array(dtype, 2, "C", readonly=True)  # [rows, row_items]


_TABLE = types.Array(types.float32, 1, "C", readonly=True)  # [65536] float16 values
_ACTIVATIONS = types.Array(types.float32, 2, "C")  # x [N, cols]
_RESULT = types.Array(types.float32, 2, "A")  # out [N, rows]: a column range of a larger result
_NO_SCALES = _storage(types.uint8)  # [rows, 0]


def _signature(storage, scales=_NO_SCALES):
    """(data, scales, f16, run, x, start, stop, out) -> None, for storage of dtype ``storage`` and these scales."""
    return types.void(_storage(storage), scales, _TABLE, types.int64, _ACTIVATIONS, types.int64, types.int64, _RESULT)


_FLOATS = _storage(types.float32)
_COMPILE = dict(cache=True, nogil=True)


@njit(nogil=True, fastmath=True)
def _dot_rows(buf, x, out, column):
    """out[:, column] = x [N, cols] @ buf [cols]: four activation rows per pass over the buffer."""
    n, cols = x.shape
    b = 0
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


# Each product: out [N, stop-start] = x [N, cols] @ W[start:stop].T, W's rows expanded one at a time into
# buf (kestrel_trio._kernels.rows gives each argument's meaning) and multiplied at once.


def product_int8(data, scales, f16, run, x, start, stop, out):
    buf = np.empty(x.shape[1], np.float32)  # [cols]
    for r in range(start, stop):
        row_int8(data[r], scales[r], f16, run, buf)
        _dot_rows(buf, x, out, r - start)


def product_bf16(data, scales, f16, run, x, start, stop, out):
    buf = np.empty(x.shape[1], np.float32)  # [cols]
    for r in range(start, stop):
        row_bf16(data[r], scales[r], f16, run, buf)
        _dot_rows(buf, x, out, r - start)


def product_f32(data, scales, f16, run, x, start, stop, out):
    for r in range(start, stop):
        _dot_rows(data[r], x, out, r - start)  # already float32: no expansion


def product_f16(data, scales, f16, run, x, start, stop, out):
    buf = np.empty(x.shape[1], np.float32)  # [cols]
    for r in range(start, stop):
        row_f16(data[r], scales[r], f16, run, buf)
        _dot_rows(buf, x, out, r - start)


def product_q8_0(data, scales, f16, run, x, start, stop, out):
    buf = np.empty(x.shape[1], np.float32)  # [cols]
    for r in range(start, stop):
        row_q8_0(data[r], scales[r], f16, run, buf)
        _dot_rows(buf, x, out, r - start)


def product_q4_0(data, scales, f16, run, x, start, stop, out):
    buf = np.empty(x.shape[1], np.float32)  # [cols]
    for r in range(start, stop):
        row_q4_0(data[r], scales[r], f16, run, buf)
        _dot_rows(buf, x, out, r - start)


def product_q4_1(data, scales, f16, run, x, start, stop, out):
    buf = np.empty(x.shape[1], np.float32)  # [cols]
    for r in range(start, stop):
        row_q4_1(data[r], scales[r], f16, run, buf)
        _dot_rows(buf, x, out, r - start)


def product_q4_k(data, scales, f16, run, x, start, stop, out):
    buf = np.empty(x.shape[1], np.float32)  # [cols]
    for r in range(start, stop):
        row_q4_k(data[r], scales[r], f16, run, buf)
        _dot_rows(buf, x, out, r - start)


def product_q5_k(data, scales, f16, run, x, start, stop, out):
    buf = np.empty(x.shape[1], np.float32)  # [cols]
    for r in range(start, stop):
        row_q5_k(data[r], scales[r], f16, run, buf)
        _dot_rows(buf, x, out, r - start)


def product_q6_k(data, scales, f16, run, x, start, stop, out):
    buf = np.empty(x.shape[1], np.float32)  # [cols]
    for r in range(start, stop):
        row_q6_k(data[r], scales[r], f16, run, buf)
        _dot_rows(buf, x, out, r - start)


# Weights per item of each form's storage as its product takes it (34 bytes of Q8_0 hold 32).
COLUMNS_PER_ITEM = {"int8": 1, "bf16": 1, "F32": 1, "F16": 1, "BF16": 1, "Q8_0": 32 / 34, "Q4_0": 32 / 18,
                    "Q4_1": 32 / 20, "Q4_K": 256 / 144, "Q5_K": 256 / 176, "Q6_K": 256 / 210}
# Storage form -> its product (as Python), the dtype of its storage in the product's signature, the scales'
# type, and how the storage is viewed for it (None: as stored).
_PRODUCTS = {
    "int8": (product_int8, types.int8, _FLOATS, None), "bf16": (product_bf16, types.uint16, _NO_SCALES, None),
    "F32": (product_f32, types.float32, _NO_SCALES, np.float32),
    "F16": (product_f16, types.uint16, _NO_SCALES, np.uint16), "BF16": (product_bf16, types.uint16, _NO_SCALES, np.uint16),
    **{name: (function, types.uint8, _NO_SCALES, None) for name, function in (
        ("Q8_0", product_q8_0), ("Q4_0", product_q4_0), ("Q4_1", product_q4_1), ("Q4_K", product_q4_k),
        ("Q5_K", product_q5_k), ("Q6_K", product_q6_k))},
}
FORMS = frozenset(_PRODUCTS)
_compiled: dict = {}
_compile_lock = threading.Lock()


def product_for(form: str):
    """(form's compiled product, how to view its storage): compiled, or loaded from numba's cache, on first use.

    Only the forms a process uses are loaded: each costs about 3 MiB of
    resident memory, loaded or compiled (a compilation: about a second).
    """
    found = _compiled.get(form)
    if found is None:
        with _compile_lock:
            found = _compiled.get(form)
            if found is None:
                function, storage, scales, view = _PRODUCTS[form]
                compiled = njit(_signature(storage, scales), **_COMPILE)(function)
                found = _compiled[form] = (compiled, view)
    return found
