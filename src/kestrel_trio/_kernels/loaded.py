"""Whether the compiled loops run in this process, and what loading them made: facts of the process, not of a model.

numba is imported at the first :func:`ready`, not with the package: importing
numba costs about 0.2 s and 50 MiB of resident memory, which a process that
only reads checkpoints or serves no model need not pay. Where numba cannot be
imported (missing, or too old or too new for this Python or numpy) :func:`ready`
is False and :func:`unavailable_reason` says why; kestrel_trio._model then keeps
its numpy path.

What is kept here (``_state``) is the same for every model in the process: the
dispatch module once loaded ("products") or why it cannot be ("error"), the
float16 table ("table"), and the x86-64 prefill kernels once enabled
(kestrel_trio._kernels.wrappers.prefill: "tiles", "chunks", "attention" and their
"..._error"). No model's setting (products mode, threads) is kept here: each
call is given its model's.
"""

from __future__ import annotations

import ctypes
import sys
import threading

import numpy as np

from kestrel_trio._kernels import cpu as _cpu
from kestrel_trio._kernels.portable.forms.stamp import StaleProducts

__all__ = ["FORMS", "PRODUCT_MODES", "RUN", "ready", "compiled", "unavailable_reason", "dispatch", "f16",
           "decode_loops", "release_compiler_pages"]

# The storage forms the compiled products know (kestrel_trio._kernels.portable.products.FORMS), known without numba.
FORMS = frozenset(("int8", "int4", "bf16", "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K",
                    "Q5_K", "Q6_K"))
# Which products quantized weights take: a model's own setting (kestrel_trio._model.products.backend.Backend.products),
# passed to each call; nothing in this package holds a mode.
PRODUCT_MODES = ("auto", "exact", "integer")
RUN = 32  # a block's inner loop length, a run-time argument (kestrel_trio._kernels.portable.forms says why)

# Before any of this package's modules imports numba: on aarch64 numba compiles for the features the kernel
# reports (AT_HWCAP), not for what LLVM reads from /proc/cpuinfo (kestrel_trio._kernels.cpu says why).
_cpu.configure_numba()

_state: dict = {}
_state_lock = threading.Lock()


def ready() -> bool:
    """Whether the compiled products can run here (imports numba and loads them on the first call)."""
    if "products" in _state:
        return True
    if "error" in _state:
        return False
    with _state_lock:
        if "products" not in _state and "error" not in _state:  # not ``not _state``: the tiles keep theirs here too
            try:
                from kestrel_trio._kernels import dispatch as products  # the loops and what chooses among them
            except StaleProducts:  # not a reason to run without the loops: products.py must be regenerated
                raise
            except Exception as error:  # numba missing, or too old or too new for this Python or numpy
                _state["error"] = f"numba cannot be imported ({type(error).__name__}: {error})"
            else:
                if products.FORMS != FORMS:
                    raise AssertionError("kestrel_trio._kernels.loaded.FORMS and products.FORMS disagree")
                _state["table"] = products.f16_table()  # [65536]
                _state["products"] = products
    return "products" in _state


def compiled(form: str) -> bool:
    """Whether storage form ``form`` gets the compiled product and expansion here (a form of FORMS, and ready)."""
    return form in FORMS and ready()


def unavailable_reason() -> str:
    """Why the compiled products cannot run ("" if they can, or if :func:`ready` was never called)."""
    return _state.get("error", "")


def dispatch():
    """The dispatch module (kestrel_trio._kernels.dispatch), loading it on first use.

    Raises:
        RuntimeError: the compiled loops cannot run here (:func:`unavailable_reason`).
    """
    products = _state.get("products")
    if products is None:
        if not ready():
            raise RuntimeError(unavailable_reason())
        products = _state["products"]
    return products


def f16() -> np.ndarray:
    """The float16 table every compiled product reads its float16 scales through, float32 [65536] (loaded once).

    Raises:
        RuntimeError: the compiled loops cannot run here.
    """
    table = _state.get("table")
    if table is None:  # loaded with the dispatch (a product reads it at every call: no more than a lookup then)
        dispatch()
        table = _state["table"]
    return table


def decode_loops():
    """(_kernels.portable.integer, .chunk_qkv, .exp, .norm): the compiled loops a decode step of one sequence
    calls directly, without the wrappers' checks (kestrel_trio._model.decoder.decode_step checks its arrays once);
    None where the compiled loops cannot run."""
    if not ready():
        return None
    from kestrel_trio._kernels.portable import chunk_qkv, exp, integer, norm

    return integer, chunk_qkv, exp, norm


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
    if "products" not in _state or not sys.platform.startswith("linux"):
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
