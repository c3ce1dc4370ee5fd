"""Compiled loops over numpy arrays (numba): the products of packed weights that numpy cannot fuse.

numba compiles these plain-Python loops with LLVM when first called and
caches the machine code on disk, so a later process loads them in
milliseconds. Nothing here knows a model: each function takes arrays and row
ranges. kestrel_trio._model decides when to call them and keeps its numpy
path for what they do not cover (and for a Python that numba does not
support yet: :data:`AVAILABLE` is then False and :data:`UNAVAILABLE_REASON`
says why).
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["AVAILABLE", "UNAVAILABLE_REASON", "FORMS", "packed_product", "packed_expand", "release_compiler_pages",
           "describe"]

try:
    import numpy as np

    from kestrel_trio._kernels.products import expand as _expand, product as _product
    from kestrel_trio._kernels.rows import ROW_EXPANDERS, f16_table
except ImportError as error:  # numba missing or too old for this Python
    AVAILABLE, UNAVAILABLE_REASON, FORMS = False, f"numba cannot be imported ({error})", frozenset()
else:
    AVAILABLE, UNAVAILABLE_REASON, FORMS = True, "", frozenset(ROW_EXPANDERS)
    _F16 = f16_table()  # [65536]
    _NO_SCALE = np.zeros((1, 1), dtype=np.float32)  # [1, 1]
    _RUN = 32  # a block's inner loop length, an argument so that it stays a run-time value (rows.py)


def _scales(scales, data):
    """The scales as [rows, groups]; none: a stand-in row repeated (stride 0) that no expander reads."""
    return np.broadcast_to(_NO_SCALE, (data.shape[0], 1)) if scales is None else scales


def describe() -> str:
    """One line for the start-up log: which products packed weights get."""
    if not AVAILABLE:
        return f"numpy expansion and BLAS ({UNAVAILABLE_REASON})"
    import numba

    return f"compiled row products (numba {numba.__version__})"


def packed_product(form: str, data, scales, x, start: int, stop: int, out) -> None:
    """``out`` [N, stop-start] = ``x`` [N, cols] @ W[start:stop].T for W stored as ``form`` (one of FORMS).

    Args:
        form: "int8", "int4", "bf16" or a ggml type name.
        data: the rows' storage as kestrel_trio._kernels.rows describes it.
        scales: int8's float32 [rows, 1], int4's float16 bits [rows, groups], or None.
        x: float32 [N, cols], C-contiguous.
        start, stop: weight rows.
        out: float32 [N, stop-start], any strides.
    """
    _product(ROW_EXPANDERS[form], data, _scales(scales, data), _F16, _RUN, x, start, stop, out)


def packed_expand(form: str, data, scales, start: int, stop: int, out) -> None:
    """``out`` [stop-start, cols] = W[start:stop] as its float32 weights, bit for bit as ggml expands them."""
    _expand(ROW_EXPANDERS[form], data, _scales(scales, data), _F16, _RUN, start, stop, out)


# madvise(2) advice: reclaim these pages now (Linux 5.4+); clean file pages are simply dropped.
_MADV_PAGEOUT = 21


def release_compiler_pages() -> int:
    """Hand back the resident pages of LLVM's code (libllvmlite), which only a compilation needs; bytes advised.

    Importing numba maps libllvmlite (about 170 MiB) and its start-up touches
    about 100 MiB of it: clean pages of the file, which the kernel would drop
    only under memory pressure, but which count in the process's RSS and
    crowd a small board's page cache. Once the products are compiled (or
    loaded from numba's cache) nothing runs that code, so ``MADV_PAGEOUT``
    lets them go now. A later compilation faults them back in from the file:
    slower once, never wrong. A no-op (0) off Linux or where the advice is
    unknown.
    """
    if not AVAILABLE or not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            ranges = [line.split()[0] for line in maps if "libllvmlite" in line]
    except (OSError, AttributeError):
        return 0
    advised = 0
    for span in ranges:
        start, stop = (int(end, 16) for end in span.split("-"))
        if madvise(start, stop - start, _MADV_PAGEOUT) == 0:
            advised += stop - start
    return advised
