"""The numba types of the compiled products' and expansions' arguments: one explicit signature a storage form,
so that any C-contiguous storage, writable or mapped read-only, converts to it and no call compiles another
version (kestrel_trio._kernels.dispatch compiles each form's functions with these)."""

from __future__ import annotations

from numba import types

__all__: list[str] = []  # the dispatch's and the generated products' own: kestrel_trio._kernels.dispatch


def _storage(dtype) -> types.Array:
    return types.Array(dtype, 2, "C", readonly=True)  # [rows, row_items]


_TABLE = types.Array(types.float32, 1, "C", readonly=True)  # [65536] float16 values
_ACTIVATIONS = types.Array(types.float32, 2, "C")  # x [N, cols]
_RESULT = types.Array(types.float32, 2, "A")  # out [N, rows]: a column range of a larger result
_NO_SCALES = _storage(types.uint8)  # [rows, 0]


def _signature(storage, scales=_NO_SCALES):
    """(data, scales, f16, run, x, start, stop, out) -> None, for storage of dtype ``storage`` and these scales."""
    return types.void(_storage(storage), scales, _TABLE, types.int64, _ACTIVATIONS, types.int64, types.int64, _RESULT)


def _expand_signature(storage, scales=_NO_SCALES):
    """(data, scales, f16, run, start, stop, out) -> None: ``out`` float32 [stop-start, cols], C-contiguous."""
    return types.void(_storage(storage), scales, _TABLE, types.int64, types.int64, types.int64,
                      types.Array(types.float32, 2, "C"))


_FLOATS = _storage(types.float32)  # int8's scales: float32 [rows, 1]
_COMPILE = dict(cache=True, nogil=True)  # every product and expansion: cached on disk, releasing the GIL
