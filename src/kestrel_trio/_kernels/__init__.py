"""Compiled loops over numpy arrays (numba): the products of packed weights that numpy cannot fuse.

numba compiles these plain-Python loops with LLVM and caches the machine code
on disk, so a later process loads them in milliseconds. Nothing here knows a
model: each function takes arrays and row ranges. kestrel_trio._model
decides when to call them and keeps its numpy path for what they do not
cover, and for a Python that numba does not support: :func:`ready` is then
False and :func:`unavailable_reason` says why.

numba is imported at the first :func:`ready`, not with this package:
importing numba costs about 0.2 s and 50 MiB of resident memory, which a
process that only reads checkpoints or serves no model need not pay.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
import time
import numpy as np

from kestrel_trio._kernels import cpu as _cpu

__all__ = ["FORMS", "ready", "compiled", "unavailable_reason", "describe", "describe_cpu", "product_kernels",
           "optional_kernels", "PRODUCT_MODES", "prepare", "packed_product",
           "quantize_activations", "packed_expand", "packed_weights", "release_compiler_pages", "enable_tiles",
           "tile_product", "tile_pack", "tile_multiply", "enable_chunk_products", "chunk_product",
           "CHUNK_WEIGHT_ROWS", "CHUNK_K_STEP", "enable_prefill_attention", "prefill_attention", "qkv_rows",
           "TILE_BLOCK_ROWS", "TILE_K_STEP", "rotate_half", "rms_norm", "softmax_numerators", "swiglu",
           "decode_attention", "decode_buffers", "decode_attentions", "norm_span", "integer_rows", "integer_job",
           "decode_loops"]

# The storage forms the compiled products know (kestrel_trio._kernels.products.FORMS), known without numba.
FORMS = frozenset(("int8", "int4", "bf16", "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K",
                    "Q5_K", "Q6_K"))
# Which products quantized weights take: a model's own setting (kestrel_trio._model.products.backend.Backend.products),
# passed to each call here; nothing in this package holds a mode.
PRODUCT_MODES = ("auto", "exact", "integer")
_RUN = 32  # a block's inner loop length, an argument so that it stays a run-time value (products.py)

log = logging.getLogger("kestrel_trio.kernels")

# Before any of this package's modules imports numba: on aarch64 numba compiles for the features the kernel
# reports (AT_HWCAP), not for what LLVM reads from /proc/cpuinfo (kestrel_trio._kernels.cpu says why).
_cpu.configure_numba()

# "products": the compiled module, or "error": why it cannot be had; "table": the float16 table. Facts of this
# process (the same for every model), loaded once: no model's setting is kept here.
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
            except Exception as error:  # numba missing, or too old or too new for this Python or numpy
                _state["error"] = f"numba cannot be imported ({type(error).__name__}: {error})"
            else:
                if products.FORMS != FORMS:
                    raise AssertionError("kestrel_trio._kernels.FORMS and products.FORMS disagree")
                _state["table"] = products.f16_table()  # [65536]
                _state["products"] = products
    return "products" in _state


def compiled(form: str) -> bool:
    """Whether storage form ``form`` gets the compiled product and expansion here (a form of FORMS, and ready)."""
    return form in FORMS and ready()


def unavailable_reason() -> str:
    """Why the compiled products cannot run ("" if they can, or if :func:`ready` was never called)."""
    return _state.get("error", "")


def describe() -> str:
    """One line for the start-up log: which products packed weights get."""
    if not ready():
        return f"numpy expansion and BLAS ({unavailable_reason()})"
    import numba

    return f"compiled row products (numba {numba.__version__})"


def describe_cpu() -> str:
    """The CPU the compiled code is for and the features the kernels saw, e.g. "cortex-a76 dotprod fp16 neon".

    On x86-64 the name is LLVM's for this host (numba compiles for it) once the kernels are loaded.
    """
    cpu = _cpu.this_cpu()
    if cpu.name == "host" and ready():
        import llvmlite.binding as llvm_binding

        return " ".join((llvm_binding.get_host_cpu_name(), *cpu.features))
    return cpu.describe()


def optional_kernels() -> dict[str, str | None]:
    """Each kernel family that not every host runs, and None where it runs here, else why not (one line each).

    Loads (or compiles) each family that can run, as a model's load would: for test reports and bug reports.
    """
    assembly = _products().f32_assembly() if ready() else None
    return {
        "compiled loops (numba)": None if ready() else unavailable_reason(),
        "float32 assembly blocks (x86-64 AVX2/AVX-512)": None if assembly else (
            unavailable_reason() or f"no AVX2 or AVX-512 block for this CPU ({describe_cpu()})"),
        "float32 chunk products (Intel AVX-512)": enable_chunk_products(),
        "chunk attention (AVX2/AVX-512)": enable_prefill_attention(),
        "bf16 tile products (AMX)": enable_tiles(),
    }


def product_kernels(forms, mode: str) -> dict[str, str]:
    """For each storage form of ``forms`` (names in FORMS), the kernel its products take in products ``mode``
    (one of PRODUCT_MODES) on this CPU.

    "portable": the compiled reference loops (kestrel_trio._kernels.products), compiled for :func:`describe_cpu`;
    "avx512", "avx2", "avx2+avx512": an x86-64 assembly block, from four activation rows; "numpy": numba
    cannot run here (numpy expansion and BLAS). Names outside FORMS are left out.
    """
    wanted = sorted(set(forms) & FORMS)
    if not ready():
        return {form: "numpy" for form in wanted}
    return {form: _products().kernel_name(form, mode) for form in wanted}


def _products():
    """The compiled module (loading it on first use); RuntimeError where it cannot be had."""
    products = _state.get("products")
    if products is None:
        if not ready():
            raise RuntimeError(unavailable_reason())
        products = _state["products"]
    return products


def packed_product(form: str, data: np.ndarray, scales: np.ndarray | None, x: np.ndarray, start: int, stop: int,
                   out: np.ndarray, quantized: tuple | None = None, *, mode: str = "exact") -> None:
    """``out`` [N, stop-start] = ``x`` [N, cols] @ W[start:stop].T for W stored as ``form`` (one of FORMS).

    Args:
        form: "int8", "int4", "bf16" or a ggml type name.
        data: the rows' storage [rows, ...], C-contiguous: int8 (int8), uint16 (bf16), uint8 (int4's nibbles,
            a GGUF tensor's bytes).
        scales: int8's float32 [rows, 1], int4's float16 [rows, groups], or None.
        x: float32 [N, cols], C-contiguous.
        start, stop: weight rows.
        out: float32 [N, stop-start], any strides.
        quantized: :func:`quantize_activations` of ``x`` for these forms, made once for every product that
            takes ``x`` (None: an integer product quantizes ``x`` itself).
        mode: the products' mode (one of PRODUCT_MODES; the model's): "exact" expands every weight to float32.
    """
    product, _, data, scales = _typed(form, data, scales, mode)
    if quantized is not None and getattr(product, "takes_quantized", False):
        product(data, scales, _state["table"], _RUN, x, start, stop, out, quantized)
    else:
        product(data, scales, _state["table"], _RUN, x, start, stop, out)


def quantize_activations(x: np.ndarray, forms, mode: str) -> tuple | None:
    """``x`` float32 [N, cols] (C-contiguous) quantized to int8 per block of 32 for the integer products of
    ``forms`` (names in FORMS) that products ``mode`` (one of PRODUCT_MODES) takes, once for all of them; None
    where none does. Hand it to :func:`packed_product` with the same ``x`` and ``mode``."""
    if not ready():
        return None
    return _products().quantize(x, forms, mode)


def integer_rows(form: str, data: np.ndarray, mode: str) -> tuple | None:
    """``form``'s integer product bound to its GGUF rows ``data`` (uint8 [rows, row_bytes]) and whether it reads
    the activations' block sums, or None where ``form`` takes the exact products in products ``mode`` (one of
    PRODUCT_MODES) here (or nothing is compiled):
    kestrel_trio._kernels.dispatch.integer_rows. For a decode step's calls without per-call dispatch."""
    if not ready() or form not in FORMS:
        return None
    return _products().integer_rows(form, data, _state["table"], mode)


def integer_job(form: str, mode: str) -> tuple[int, int] | None:
    """(``form``'s integer kernel's job entry address, its form id) in products ``mode`` for a compiled hand-off
    (kestrel_trio._kernels.handoff), or None: kestrel_trio._kernels.dispatch.integer_job."""
    if not ready() or form not in FORMS:
        return None
    return _products().integer_job(form, mode)


def decode_loops():
    """(kestrel_trio._kernels.integer, .chunk_qkv, .exp, .norm): the compiled loops a decode step of one sequence calls
    directly, without the wrappers' checks (kestrel_trio._model.decoder.decode_step checks its arrays once); None where
    the compiled loops cannot run."""
    if not ready():
        return None
    from kestrel_trio._kernels import chunk_qkv, exp, integer, norm

    return integer, chunk_qkv, exp, norm


def packed_expand(form: str, data: np.ndarray, scales: np.ndarray | None, start: int, stop: int,
                  out: np.ndarray) -> None:
    """``out`` [stop-start, cols] (float32, C-contiguous) = W[start:stop], exactly (arguments as packed_product)."""
    expand, data, scales = _expansion(form, data, scales)
    expand(data, scales, _state["table"], _RUN, start, stop, out)


def prepare(forms, mode: str) -> None:
    """Compile, or load from numba's cache, the products of ``forms`` (names in FORMS) in products ``mode`` (one
    of PRODUCT_MODES), and their expansions, now.

    And the layers' loops every model steps with (exponentials, decode
    attention). Then hand back the compiler's pages
    (:func:`release_compiler_pages`): loading uses LLVM too, so a loop loaded
    later would touch them again.
    """
    products = _products()
    started = time.perf_counter()
    wanted = sorted(set(forms) & FORMS)
    for form in wanted:
        products.warm(form, _state["table"], mode)
    _load_layer_loops()
    seconds = time.perf_counter() - started
    if seconds > 0.5:  # a compilation, not a load from numba's cache: say why the start took longer
        log.info("compiled the products of %s and the layers' loops in %.1f s (cached on disk for later starts)",
                 ", ".join(wanted) or "no packed form", seconds)
    release_compiler_pages()


def _load_layer_loops() -> None:
    """Run the exponentials' loops and decode attention once on tiny arrays of the types a forward passes them."""
    scores = np.zeros((1, 2, 3), dtype=np.float32)  # [h, rows, seen]
    softmax_numerators(scores)
    swiglu(np.zeros((1, 4), dtype=np.float32))  # [N, 2*inter]
    cache = np.zeros((1, 2, 4), dtype=np.float32)  # [n_kv, capacity, hd]
    decode_attention(np.zeros((2, 4), dtype=np.float32), cache[:, :1], cache[:, :1], 0.5)
    weight = np.ones(4, dtype=np.float32)  # [dim]
    rms_norm(np.zeros((1, 4), dtype=np.float32), weight, 1e-6)  # [T, hidden]; q/k head views take the same loop
    for norm in (weight, None):  # Qwen3's heads, normed; Llama's and Qwen2.5's, not
        qkv_rows(np.zeros((1, 12), dtype=np.float32), 1, 1, 4, norm, norm, 1e-6, weight[None, :2], weight[None, :2],
                 cache, cache, 0, None, None)
    # a decode step's one-call quantization (kestrel_trio._model.decoder.decode_step)
    from kestrel_trio._kernels import integer

    row = np.zeros((1, 32), dtype=np.float32)  # [1, 32]
    integer.quantize_rows(row, _RUN, np.empty((1, 32), np.int8), row[:, :1].copy(), row[:, :1].copy(), True)
    enable_prefill_attention()


def _typed(form: str, data: np.ndarray, scales: np.ndarray | None, mode: str):
    """(the form's product in ``mode`` and its expansion, its storage and scales as their signatures take them)."""
    product, expand, view = _products().product_for(form, mode)
    return (product, expand, *_as_typed(data, scales, view))


def _expansion(form: str, data: np.ndarray, scales: np.ndarray | None):
    """(the form's expansion, its storage and scales as its signature takes them): no product compiled for it."""
    expand, view = _products().expansion_for(form)
    return (expand, *_as_typed(data, scales, view))


def _as_typed(data: np.ndarray, scales: np.ndarray | None, view) -> tuple[np.ndarray, np.ndarray]:
    if scales is None:
        scales = np.empty((data.shape[0], 0), dtype=np.uint8)  # [rows, 0]
    elif scales.dtype == np.float16:
        scales = scales.view(np.uint16)  # numba has no float16: the bits, looked up in the table
    return (data if view is None else data.view(view)), scales


def packed_weights(form: str, data: np.ndarray, scales: np.ndarray | None, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) as the compiled code expands them, float32 [stop-start, cols] (tests, tools)."""
    expand, data, scales = _expansion(form, data, scales)
    cols = round(_products().COLUMNS_PER_ITEM[form] * data.shape[1])  # data: [rows, items] as the expansion reads it
    out = np.empty((stop - start, cols), dtype=np.float32)  # [rows, cols]
    expand(data, scales, _state["table"], _RUN, start, stop, out)
    return out


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


# Query-head x key scores from which a decode step's attention is shared among the product threads: 16 heads over
# 256 keys of 128 dims, about 50 us on one thread on the 2-core Zen 5, where a hand-off costs 10-30 us. Measured
# there (Qwen3-0.6B's shapes, best / median of three step times in one process), 8 sequences of 64 keys: 77.6 /
# 78.1 ms from 4 Ki scores, 80.1 / 82.7 from 16 Ki (not shared), 83.1 / 86.2 never shared; 16 of 64: 120.3 /
# 122.0, 123.2 / 123.7, 127.8 / 132.5.
SHARED_DECODE_SCORES = 1 << 12


# The wrappers of the layers' loops and of the x86-64 prefill kernels, re-exported: imported last, as they read this
# module's state (ready, _state, SHARED_DECODE_SCORES) through it.
from kestrel_trio._kernels.layers import (  # noqa: E402
    decode_attention, decode_attentions, decode_buffers, norm_span, qkv_rows, rms_norm, rotate_half,
    softmax_numerators, swiglu)
from kestrel_trio._kernels.x86.prefill import (  # noqa: E402
    CHUNK_K_STEP, CHUNK_WEIGHT_ROWS, TILE_BLOCK_ROWS, TILE_K_STEP, chunk_product,
    enable_chunk_products, enable_prefill_attention, enable_tiles, prefill_attention, tile_multiply, tile_pack,
    tile_product)
