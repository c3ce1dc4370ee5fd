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
from typing import Callable, Sequence

import numpy as np

from kestrel_trio._kernels import cpu as _cpu

__all__ = ["FORMS", "ready", "compiled", "unavailable_reason", "describe", "describe_cpu", "product_kernels",
           "optional_kernels", "set_products", "product_mode", "PRODUCT_MODES", "prepare", "packed_product",
           "quantize_activations", "packed_expand", "packed_weights", "release_compiler_pages", "enable_tiles",
           "tile_product", "tile_pack", "tile_multiply", "enable_chunk_products", "chunk_product",
           "CHUNK_WEIGHT_ROWS", "CHUNK_K_STEP", "enable_prefill_attention", "prefill_attention", "qkv_rows",
           "TILE_BLOCK_ROWS", "TILE_K_STEP", "rotate_half", "rms_norm", "softmax_numerators", "swiglu",
           "decode_attention", "decode_buffers", "decode_attentions"]

# The storage forms the compiled products know (kestrel_trio._kernels.products.FORMS), known without numba.
FORMS = frozenset(("int8", "int4", "bf16", "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K",
                    "Q5_K", "Q6_K"))
PRODUCT_MODES = ("auto", "exact", "integer")  # set_products
_RUN = 32  # a block's inner loop length, an argument so that it stays a run-time value (products.py)

log = logging.getLogger("kestrel_trio.kernels")

# Before any of this package's modules imports numba: on aarch64 numba compiles for the features the kernel
# reports (AT_HWCAP), not for what LLVM reads from /proc/cpuinfo (kestrel_trio._kernels.cpu says why).
_cpu.configure_numba()

_state: dict = {}  # "products": the compiled module, or "error": why it cannot be had
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
                from kestrel_trio._kernels import products
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


def product_kernels(forms) -> dict[str, str]:
    """For each storage form of ``forms`` (names in FORMS), the kernel its products take in this process.

    "portable": the compiled reference loops (kestrel_trio._kernels.products), compiled for :func:`describe_cpu`;
    "avx512", "avx2", "avx2+avx512": an x86-64 assembly block, from four activation rows; "numpy": numba
    cannot run here (numpy expansion and BLAS). Names outside FORMS are left out.
    """
    wanted = sorted(set(forms) & FORMS)
    if not ready():
        return {form: "numpy" for form in wanted}
    return {form: _products().kernel_name(form) for form in wanted}


def set_products(mode: str) -> None:
    """Which products quantized weights take, process-wide (before a model's first step): "exact" (expanded to
    float32, multiplied in float32: the reference), "integer" (activations quantized to int8 per block of 32,
    integer block sums as llama.cpp's) or "auto" (integer where this CPU has integer kernels of its own for the
    form, as kestrel_trio._kernels.plan's integer_auto says; exact elsewhere). Forms a product was already made
    for keep it for the mode it was made in and take the new mode's at their next call
    (kestrel_trio._kernels.products.product_for).

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in PRODUCT_MODES:
        raise ValueError(f"products must be one of {', '.join(PRODUCT_MODES)}, got {mode!r}")
    _state["mode"] = mode


def product_mode() -> str:
    """The mode :func:`set_products` set ("auto" at first)."""
    return _state.get("mode", "auto")


def _products():
    """The compiled module (loading it on first use); RuntimeError where it cannot be had."""
    products = _state.get("products")
    if products is None:
        if not ready():
            raise RuntimeError(unavailable_reason())
        products = _state["products"]
    return products


def packed_product(form: str, data: np.ndarray, scales: np.ndarray | None, x: np.ndarray, start: int, stop: int,
                   out: np.ndarray, quantized: tuple | None = None) -> None:
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
    """
    product, _, data, scales = _typed(form, data, scales)
    if quantized is not None and getattr(product, "takes_quantized", False):
        product(data, scales, _state["table"], _RUN, x, start, stop, out, quantized)
    else:
        product(data, scales, _state["table"], _RUN, x, start, stop, out)


def quantize_activations(x: np.ndarray, forms) -> tuple | None:
    """``x`` float32 [N, cols] (C-contiguous) quantized to int8 per block of 32 for the integer products of
    ``forms`` (names in FORMS) that this process takes (:func:`set_products`), once for all of them; None where
    none does. Hand it to :func:`packed_product` with the same ``x``."""
    if not ready():
        return None
    return _products().quantize(x, forms)


def integer_rows(form: str, data: np.ndarray) -> tuple | None:
    """``form``'s integer product bound to its GGUF rows ``data`` (uint8 [rows, row_bytes]) and whether it reads
    the activations' block sums, or None where ``form`` takes the exact products here (or nothing is compiled):
    kestrel_trio._kernels.products.integer_rows. For a decode step's calls without per-call dispatch."""
    if not ready() or form not in FORMS:
        return None
    return _products().integer_rows(form, data, _state["table"])


def decode_loops():
    """(kestrel_trio._kernels.integer, .chunk_qkv, .exp, .norm): the compiled loops a decode step of one sequence calls
    directly, without the wrappers' checks (kestrel_trio._model.decode_step checks its arrays once); None where
    the compiled loops cannot run."""
    if not ready():
        return None
    from kestrel_trio._kernels import chunk_qkv, exp, integer, norm

    return integer, chunk_qkv, exp, norm


def norm_span(x: np.ndarray) -> tuple[np.ndarray, int, int] | None:
    """(the span, row stride, head stride) :func:`rms_norm` hands its compiled loop for ``x`` float32 [T, dim] or
    [T, heads, dim], or None where it would not take it: so that a caller holding fixed buffers calls the loop
    itself with the same arguments (kestrel_trio._model.decode_step)."""
    rows = x if x.ndim == 3 else x[:, None, :]  # [T, heads, dim]
    flat = _unit_stride_span(rows)  # [span]
    return None if flat is None else (flat, rows.strides[0] // 4, rows.strides[1] // 4)


def packed_expand(form: str, data: np.ndarray, scales: np.ndarray | None, start: int, stop: int,
                  out: np.ndarray) -> None:
    """``out`` [stop-start, cols] (float32, C-contiguous) = W[start:stop], exactly (arguments as packed_product)."""
    _, expand, data, scales = _typed(form, data, scales)
    expand(data, scales, _state["table"], _RUN, start, stop, out)


def prepare(forms) -> None:
    """Compile, or load from numba's cache, the products and expansions of ``forms`` (names in FORMS) now.

    And the layers' loops every model steps with (exponentials, decode
    attention). Then hand back the compiler's pages
    (:func:`release_compiler_pages`): loading uses LLVM too, so a loop loaded
    later would touch them again.
    """
    products = _products()
    started = time.perf_counter()
    wanted = sorted(set(forms) & FORMS)
    for form in wanted:
        products.warm(form, _state["table"])
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
    from kestrel_trio._kernels import integer  # a decode step's one-call quantization (kestrel_trio._model.decode_step)

    row = np.zeros((1, 32), dtype=np.float32)  # [1, 32]
    integer.quantize_rows(row, _RUN, np.empty((1, 32), np.int8), row[:, :1].copy(), row[:, :1].copy(), True)
    enable_prefill_attention()


def _typed(form: str, data: np.ndarray, scales: np.ndarray | None):
    """(the form's product and expansion, its storage and scales as their signatures take them)."""
    product, expand, view = _products().product_for(form)
    if scales is None:
        scales = np.empty((data.shape[0], 0), dtype=np.uint8)  # [rows, 0]
    elif scales.dtype == np.float16:
        scales = scales.view(np.uint16)  # numba has no float16: the bits, looked up in the table
    return product, expand, (data if view is None else data.view(view)), scales


def packed_weights(form: str, data: np.ndarray, scales: np.ndarray | None, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) as the compiled code expands them, float32 [stop-start, cols] (tests, tools)."""
    _, expand, data, scales = _typed(form, data, scales)
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


# ---------------------------------------------------------------- bf16 tile products (AMX)

TILE_BLOCK_ROWS = 32  # weight rows a tile product takes at a time (kestrel_trio._kernels.x86.tiles.BLOCK_ROWS)
TILE_K_STEP = 32  # the product's K must be a multiple of this (tiles.K_STEP)


def enable_tiles() -> str | None:
    """Make the bf16 tile products (AMX) usable in this process: None if they are, else why not (one line)."""
    return _enable_once("tiles", _load_tiles)


def _load_tiles() -> tuple[object, str | None]:
    from kestrel_trio._kernels.plan import this_plan

    try:
        planned = this_plan().tiles
    except Exception as error:  # numba or llvmlite missing or unusable (the plan reads LLVM's host features)
        return None, f"numba cannot be imported ({type(error).__name__}: {error})"
    if planned.variant == "none":
        return None, planned.why
    try:
        from kestrel_trio._kernels.x86 import tiles
    except Exception as error:  # numba or llvmlite missing or unusable
        return None, f"numba cannot be imported ({type(error).__name__}: {error})"
    try:
        return tiles, tiles.enable() or _tiles_self_test(tiles)
    except Exception as error:  # e.g. numba told to compile for a CPU without AMX (NUMBA_CPU_NAME)
        return None, f"the AMX tile product cannot be compiled here ({type(error).__name__}: {error})"


def _enable_once(key: str, load: Callable[[], tuple[object, str | None]]) -> str | None:
    """None if ``_state[key]`` holds a usable module, else why not: ``load`` (module, reason) runs once a process.

    Under the state lock, so ``load`` must not call :func:`ready` (which takes it too). The module is kept only
    when its reason is None.
    """
    error_key = f"{key}_error"
    if key not in _state and error_key not in _state:
        with _state_lock:
            if key not in _state and error_key not in _state:
                module, reason = load()
                if reason is None:
                    _state[key] = module
                else:
                    _state[error_key] = reason
    return _state.get(error_key)


def _tiles_self_test(tiles) -> str | None:
    """Compile (or load) both tile products and check them on 33 x 64 times 64 x 64 against numpy; None if they agree.

    Both now, at start-up, so that no prompt waits for a compilation (float32 weights' and bf16 weights').
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((33, 64)).astype(np.float32)  # [33, 64]
    w = _bf16_values(rng.standard_normal((64, 64)).astype(np.float32))  # [64, 64], values bf16 holds exactly
    packed = np.empty((4, 2, 16, 16, 2), dtype=np.uint16)  # [m_tiles, K/32, 16, 16, 2]
    tiles.pack_rows(x, packed)
    expected = _bf16_values(x) @ w.T  # [33, 64]
    for kernel, weights in ((tiles.product, w), (tiles.product_bits, (w.view(np.uint32) >> 16).astype(np.uint16))):
        got = np.empty((33, 64), dtype=np.float32)  # [33, 64]
        kernel(packed, 33, weights, 0, 64, got, tiles.CONFIG)
        if not np.allclose(got, expected, rtol=1e-5, atol=1e-4):
            return f"the AMX tile product ({kernel.__name__}) disagreed with numpy in its self-test"
    return None


def _bf16_values(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bf16 (nearest even), as float32."""
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return (rounded << np.uint32(16)).astype(np.uint32).view(np.float32)


def tile_product(x: np.ndarray, matrices: list[np.ndarray], run: Callable[[list[Callable[[], None]]], None],
                 shares: Callable[[int], list[tuple[int, int]]]) -> np.ndarray:
    """``x`` [M, K] @ the matrices stacked by rows, transposed, through bf16 tiles: float32 [M, sum of their rows].

    ``x`` is rounded and packed once (:func:`tile_pack`) for all of them. Each matrix [N_i, K], float32 or
    bf16 bits (uint16), C-contiguous, K and N_i multiples of 32, its rows split into ``shares(N_i // 32)``
    ranges of 32-row blocks, run by ``run`` (a list of tasks, each on its own thread). :func:`enable_tiles` first.
    """
    m = x.shape[0]
    packed = tile_pack(np.ascontiguousarray(x, dtype=np.float32))
    out = np.empty((m, sum(w.shape[0] for w in matrices)), dtype=np.float32)  # [M, sum N_i]
    first = 0
    for w in matrices:
        tile_multiply(packed, m, w, out[:, first : first + w.shape[0]], run, shares)
        first += w.shape[0]
    return out


def tile_pack(x: np.ndarray) -> np.ndarray:
    """``x`` float32 [M, K], C-contiguous, rounded to bf16 and packed as the tile products take it."""
    m, k = x.shape
    m_tiles = -(-m // 32) * 2  # the kernel takes activation tiles two at a time
    packed = np.empty((m_tiles, k // TILE_K_STEP, 16, 16, 2), dtype=np.uint16)  # [m_tiles, K/32, 16, 16, 2]
    _state["tiles"].pack_rows(x, packed)
    return packed


def tile_multiply(packed: np.ndarray, m: int, w: np.ndarray, out: np.ndarray,
                  run: Callable[[list[Callable[[], None]]], None],
                  shares: Callable[[int], list[tuple[int, int]]]) -> None:
    """``out`` [m, N] (any row stride, unit column stride) = the rows :func:`tile_pack` packed @ ``w``.T."""
    tiles = _state["tiles"]
    kernel = tiles.product_bits if w.dtype == np.uint16 else tiles.product
    run([(lambda a=a, b=b: kernel(packed, m, w, a * TILE_BLOCK_ROWS, b * TILE_BLOCK_ROWS, out, tiles.CONFIG))
         for a, b in shares(w.shape[0] // TILE_BLOCK_ROWS) if b > a])


# ---------------------------------------------------------------- float32 prefill chunks (AVX-512)
# The shapes kestrel_trio._kernels.x86.f32_chunks blocks (known without numba): chunk_product takes any shape whose K
# is a multiple of CHUNK_K_STEP, and multiplies with numpy the weight rows past whole blocks of CHUNK_WEIGHT_ROWS.
CHUNK_WEIGHT_ROWS = 14
CHUNK_K_STEP = 4


def enable_chunk_products() -> str | None:
    """Make the float32 chunk products (kestrel_trio._kernels.x86.f32_chunks) usable: None if they are, else why not.

    They run on CPUs whose float32 rows take the "avx512" assembly (Intel's AVX-512 CPUs); compiled (or loaded
    from numba's cache) and checked against numpy here, so that no prompt waits for a compilation.
    """
    if "chunks" in _state or "chunks_error" in _state:
        return _state.get("chunks_error")
    unusable = _chunks_unusable()  # outside the state lock: ready() takes it
    return _enable_once("chunks", lambda: (None, unusable) if unusable else _load_chunks())


def _load_chunks() -> tuple[object, str | None]:
    try:
        from kestrel_trio._kernels.x86 import f32_chunks

        if (f32_chunks.WEIGHT_ROWS, f32_chunks.K_STEP) != (CHUNK_WEIGHT_ROWS, CHUNK_K_STEP):
            raise AssertionError("kestrel_trio._kernels' CHUNK_ shapes and f32_chunks' disagree")
        return f32_chunks, _chunks_self_test(f32_chunks)
    except Exception as error:  # e.g. numba told to compile for another CPU (NUMBA_CPU_NAME)
        return None, f"the float32 chunk product cannot be compiled here ({type(error).__name__}: {error})"


def _chunks_unusable() -> str | None:
    if not ready():
        return unavailable_reason()
    from kestrel_trio._kernels.plan import this_plan

    planned = this_plan().chunk_products
    return None if planned.variant == "avx512" else planned.why


def _chunks_self_test(chunks) -> str | None:
    """The kernels, gathered and packed, on 64 x 1028 times 28 x 1028 (two K chunks, two weight blocks) against
    float64; None if they agree. The packed layers' norm compiles (or loads) here too: no prompt waits for it."""
    from kestrel_trio._kernels.x86 import packed_rows

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1028)).astype(np.float32)  # [64, K]
    w = rng.standard_normal((28, 1028)).astype(np.float32)  # [28, K]
    out = np.empty((64, 28), dtype=np.float32)  # [64, 28]
    packed = chunks.pack(x, 64)  # [2, K, 32]
    chunks.product(w, packed, out, 0, 28)
    packed_out = np.empty((2, 28, chunks.ACTIVATION_ROWS), dtype=np.float32)  # [2, 28, 32]
    chunks.packed_product(w, packed, packed_out, 0, 2)
    packed_rows.rms_norm(packed, np.ones(1028, dtype=np.float32), 1e-6)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)  # [64, 28]
    for name, got in (("chunk", out), ("packed", packed_rows.unpack(packed_out, 64))):
        error = np.abs(got - exact).max() / np.abs(exact).max()
        if not error < 1e-5:
            return f"the float32 {name} product disagrees with numpy here (relative error {error:.1e})"
    return None


def chunk_product(x: np.ndarray, w: np.ndarray, run: Callable[[list[Callable[[], None]]], None],
                  shares: Callable[[int], list[tuple[int, int]]]) -> np.ndarray:
    """``x`` [M, K] @ ``w`` [N, K].T in float32: [M, N]. :func:`enable_chunk_products` first.

    ``w`` float32 with unit column stride, K a multiple of 4. The kernel takes ``x``'s rows in blocks of 32,
    the last block filled out with zero rows, but for one row past whole blocks, which numpy multiplies (one
    pass over the weights, as a decode step's), and the weight rows in blocks of 14, numpy multiplying those
    past whole blocks. Rows past whole blocks given to BLAS instead cost more: a few rows make OpenBLAS pack
    every weight on one thread (a 100-token prefill took 593 ms that way against 455 with BLAS alone, 2-core
    Xeon). ``run`` runs a list of tasks, each on its own thread; ``shares(items)`` splits items among them.

    Where the blocks of activation rows split evenly, at least f32_chunks.GROUP a thread, each thread packs
    and multiplies its own rows by every weight (:func:`_chunk_product_by_rows`); else the activations are
    packed once and the weight rows shared (:func:`_chunk_product_by_weight_rows`).
    """
    chunks = _state["chunks"]
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, n = x.shape[0], w.shape[0]
    block = chunks.ACTIVATION_ROWS
    kernel_rows = (m // block if m % block == 1 else -(-m // block)) * block
    blocked_cols = n - n % chunks.WEIGHT_ROWS if kernel_rows else 0
    out = np.empty((max(m, kernel_rows), n), dtype=np.float32)  # [M rounded up to whole blocks, N]
    by_rows = shares(kernel_rows // block) if blocked_cols else []
    if len(by_rows) > 1 and len({b - a for a, b in by_rows}) == 1 and by_rows[0][1] >= chunks.GROUP:
        _chunk_product_by_rows(x, w, out, [(a * block, b * block) for a, b in by_rows], blocked_cols, run)
    else:
        _chunk_product_by_weight_rows(x, w, out, kernel_rows, blocked_cols, run, shares)
    return out[:m]


def _numpy_part(x: np.ndarray, w: np.ndarray, out: np.ndarray, rows: tuple[int, int], kernel_rows: int,
                blocked_cols: int) -> None:
    """What the kernel leaves of ``out``'s ``rows`` [start, stop): the weight rows past whole blocks of 14, and
    the row past whole blocks of 32 (when it is among them). In a task, under run's one-thread BLAS: BLAS's own
    threads would spin beside ours."""
    start, stop = rows
    top = min(stop, kernel_rows)
    if blocked_cols < w.shape[0] and top > start:
        out[start:top, blocked_cols:] = x[start:top] @ w[blocked_cols:].T  # [rows, N % 14]
    if start <= kernel_rows < stop:
        np.matmul(x[kernel_rows:stop], w.T, out=out[kernel_rows:stop])  # [1, N]


def _chunk_product_by_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray, row_shares: list[tuple[int, int]],
                           blocked_cols: int, run: Callable[[list[Callable[[], None]]], None]) -> None:
    """Each thread packs its own share of whole blocks of activation rows and multiplies it by every weight row.

    Against sharing the weight rows, the packing runs on every thread at once instead of on the caller before
    the others start, and each thread writes whole rows of ``out``. 2-core Xeon, alternated in one process,
    faster in 6 rounds of 6 at each length: 128-token prefill 411-433 ms against 440-452, 512 tokens 1735-1793
    against 1833-1922, 100 tokens 404-424 against 407-433. Each thread reads every weight, so a share has at
    least GROUP blocks: a pass over the weights for as many activation rows as when the weight rows are shared.
    """
    chunks = _state["chunks"]
    m = x.shape[0]
    kernel_rows = row_shares[-1][1]

    def task(start: int, stop: int) -> None:
        packed = chunks.pack(x[start : min(stop, m)], stop - start)  # [blocks, K, 32]
        chunks.product(w, packed, out[start:], 0, blocked_cols)
        _numpy_part(x, w, out, (start, m if stop == kernel_rows else stop), kernel_rows, blocked_cols)

    tasks = [(lambda a=a, b=b: task(a, b)) for a, b in row_shares]
    run([tasks[-1]] + tasks[:-1])  # the caller takes the last share, which has the row past whole blocks if any


def _chunk_product_by_weight_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray, kernel_rows: int,
                                  blocked_cols: int, run: Callable[[list[Callable[[], None]]], None],
                                  shares: Callable[[int], list[tuple[int, int]]]) -> None:
    """The activations packed once; the weight rows, in blocks of 14, split into ``shares(N // 14)`` ranges."""
    chunks = _state["chunks"]
    tasks = []
    if blocked_cols:
        packed = chunks.pack(x, kernel_rows)  # [blocks, K, 32]
        tasks = [(lambda a=a, b=b: chunks.product(w, packed, out, a * chunks.WEIGHT_ROWS, b * chunks.WEIGHT_ROWS))
                 for a, b in shares(blocked_cols // chunks.WEIGHT_ROWS) if b > a]
    # The calling thread takes the last share (the larger where they differ) and the numpy part: it starts at
    # once, the others after a wake-up. With them on the other thread, that thread finished 140 us after the
    # caller a product on average, and a 128-token prefill took 438-454 ms against 427-438 (2-core Xeon).
    last = tasks.pop() if tasks else (lambda: None)
    run([lambda: (last(), _numpy_part(x, w, out, (0, x.shape[0]), kernel_rows, blocked_cols))] + tasks)


# ---------------------------------------------------------------- prefill attention (AVX-512, AVX2)


def enable_prefill_attention() -> str | None:
    """Make the chunk attention (kestrel_trio._kernels.x86.f32_attention) usable: None if it is, else why not.

    Its register block by the float32 assembly this CPU takes: AVX-512's on Intel's AVX-512 CPUs, AVX2's on the
    others with AVX2 (Zen 4 and Zen 5 included: not measured there with zmm). Compiled (or loaded from numba's
    cache) and checked against numpy here: a model's load calls this (:func:`prepare`), so that no prompt waits.
    """
    if "attention" in _state or "attention_error" in _state:
        return _state.get("attention_error")
    if not ready():  # outside the state lock: ready() takes it
        reason = unavailable_reason()
        return _enable_once("attention", lambda: (None, reason))
    from kestrel_trio._kernels.plan import this_plan

    planned = this_plan().chunk_attention
    _products().f32_assembly()  # readies LLVM's assembly parser where the plan has a block: the kernel is assembly
    if planned.variant == "none":
        return _enable_once("attention", lambda: (None, planned.why))
    return _enable_once("attention", lambda: _load_attention(planned.variant == "avx512"))


def _load_attention(wide: bool) -> tuple[object, str | None]:
    try:
        from kestrel_trio._kernels.x86 import f32_attention

        lanes = f32_attention.LANES[0 if wide else 1]
        return lanes, _attention_self_test(f32_attention, lanes)
    except Exception as error:  # e.g. numba told to compile for another CPU (NUMBA_CPU_NAME)
        return None, f"the chunk attention cannot be compiled here ({type(error).__name__}: {error})"


def _attend(attention, lanes: int) -> Callable:
    """f32_attention's entry point for the register block of ``lanes``."""
    return attention.attend_heads_avx512 if lanes == attention.LANES[0] else attention.attend_heads_avx2


def _attention_self_test(attention, lanes: int) -> str | None:
    """The chunk attention of 20 queries (4 heads over 2) after 17 keys against numpy; None if they agree."""
    rng = np.random.default_rng(0)
    t, past = 20, 17
    q = rng.standard_normal((t, 4, 32)).astype(np.float32)  # [T, n_heads, head_dim]
    keys, values = rng.standard_normal((2, 2, past + t, 32)).astype(np.float32)  # [n_kv, past + T, head_dim] each
    got = np.empty((t, 4 * 32), dtype=np.float32)  # [T, n_heads*head_dim]
    _attend(attention, lanes)(q, keys, values, past, np.float32(0.25), got, 0, 2)
    scores = np.einsum("thd,hsd->hts", q.astype(np.float64), np.repeat(keys, 2, axis=0)) * 0.25  # [n_heads, T, S]
    scores[:, np.arange(past + t)[None, :] > past + np.arange(t)[:, None]] = -np.inf
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))  # [n_heads, T, S]
    exact = np.einsum("hts,hsd->thd", weights / weights.sum(axis=-1, keepdims=True), np.repeat(values, 2, axis=0))
    error = np.abs(got - exact.reshape(t, -1)).max()
    return None if error < 1e-5 else f"the chunk attention disagrees with numpy here (error {error:.1e})"


def prefill_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, past: int, scale: float,
                      run: Callable[[list[Callable[[], None]]], None] | None,
                      shares: Callable[[int], list[tuple[int, int]]] | None) -> np.ndarray | None:
    """Causal attention of T >= 2 new float32 queries in kestrel_trio._kernels.x86.f32_attention, or None.

    Args:
        q: [T, n_heads, head_dim], the newest tokens' queries.
        keys: [n_kv, past + T, head_dim], every key so far; ``values`` as ``keys``.
        past: keys before the new tokens'.
        scale: the score multiplier.
        run, shares: as :func:`chunk_product`'s, the kv heads shared among the threads; None: on this thread.

    Returns:
        [T, n_heads * head_dim]; None where the kernel is not enabled (:func:`enable_prefill_attention`: a
        model's load does it where it runs), an array is not float32, head_dim is not a multiple of 32, or the
        shapes disagree (the kernel reads ``past + T`` keys without bounds checks).
    """
    t, n_heads, head_dim = q.shape
    lanes = _state.get("attention")
    shaped = keys.shape == values.shape == (keys.shape[0], past + t, head_dim) and n_heads % keys.shape[0] == 0
    if lanes is None or t < 2 or head_dim % 32 or not shaped or not q.dtype == keys.dtype == values.dtype == np.float32:
        return None
    from kestrel_trio._kernels.x86 import f32_attention as attention  # loaded by enable_prefill_attention

    out = np.empty((t, n_heads * head_dim), dtype=np.float32)  # [T, n_heads*head_dim]
    attend = _attend(attention, lanes)
    _run_spans(lambda first, stop: attend(q, keys, values, past, np.float32(scale), out, first, stop), keys.shape[0],
               run, shares)
    return out


def _run_spans(work: Callable[[int, int], None], items: int, run: Callable[[list[Callable[[], None]]], None] | None,
               shares: Callable[[int], list[tuple[int, int]]] | None) -> None:
    """``work(first, stop)`` over ``shares(items)``, each span a task of ``run`` (the caller taking the last, as it
    starts at once); over all items on this thread where ``run`` is None or there is one span."""
    spans = [(a, b) for a, b in shares(items) if b > a] if shares is not None else [(0, items)]
    if run is None or len(spans) < 2:
        work(0, items)
        return
    tasks = [(lambda a=a, b=b: work(a, b)) for a, b in spans]
    run([tasks[-1]] + tasks[:-1])


# ---------------------------------------------------------------- a chunk's queries, keys and values


def qkv_rows(qkv: np.ndarray, n_heads: int, n_kv: int, head_dim: int, q_norm: np.ndarray | None,
             k_norm: np.ndarray | None, eps: float, cos: np.ndarray, sin: np.ndarray, keys: np.ndarray,
             values: np.ndarray, past: int, run: Callable[[list[Callable[[], None]]], None] | None,
             shares: Callable[[int], list[tuple[int, int]]] | None) -> np.ndarray | None:
    """The queries [T, n_heads, head_dim] of a fused q/k/v product, normed and rotated; its keys and values into
    the cache, in one pass (kestrel_trio._kernels.qkv_rows), or None (nothing written).

    Args:
        qkv: float32 [T, (n_heads + 2 n_kv) * head_dim], C-contiguous.
        n_heads, n_kv, head_dim: the attention's shape.
        q_norm, k_norm: float32 [head_dim] each (Qwen3's per-head RMS norms), or both None (rotation only).
        eps: the norms' epsilon.
        cos, sin: float32 [T, head_dim/2], the tokens' rotations.
        keys, values: float32 [n_kv, capacity, head_dim], a KV cache's buffers; token a goes to ``past + a``.
        past: the cache's tokens before these.
        run, shares: as :func:`chunk_product`'s, the tokens shared among the threads; None: on this thread.

    Returns:
        The queries, or None where the compiled loops cannot run or an array is not of that kind.
    """
    t = qkv.shape[0]
    norms = (q_norm, k_norm)
    floats = (qkv, cos, sin, keys, values) + (norms if q_norm is not None else ())
    if not (ready() and all(a.dtype == np.float32 for a in floats) and qkv.flags.c_contiguous and head_dim % 2 == 0
            and qkv.shape == (t, (n_heads + 2 * n_kv) * head_dim) and cos.shape == sin.shape == (t, head_dim // 2)
            and keys.shape == values.shape and keys.shape[0] == n_kv and keys.shape[1] >= past + t
            and keys.shape[2] == head_dim and (q_norm is None) == (k_norm is None)
            and all(n.shape == (head_dim,) for n in norms if n is not None)):
        return None
    from kestrel_trio._kernels import chunk_qkv  # numba is imported: this only compiles or loads the loop

    q = np.empty((t, n_heads, head_dim), dtype=np.float32)  # [T, n_heads, head_dim]
    normed = q_norm is not None
    q_weight, k_weight = (q_norm, k_norm) if normed else (cos[0], cos[0])  # unread without norms

    def rows(first: int, stop: int) -> None:
        chunk_qkv.qkv_rows(qkv, n_heads, n_kv, q_weight, k_weight, normed, np.float32(eps), cos, sin, q, keys, values,
                           past, first, stop)

    _run_spans(rows, t, run, shares)
    return q


# ---------------------------------------------------------------- rotary embedding


def rotate_half(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray | None:
    """``x`` float32 [T, heads, dim] rotated by ``cos``, ``sin`` float32 [T, dim/2], in one compiled pass.

    None where the compiled loops cannot run (:func:`ready`): the caller keeps its numpy path.
    """
    if not ready():
        return None
    from kestrel_trio._kernels import rope  # numba is imported: this only compiles or loads the loop

    out = np.empty(x.shape, dtype=np.float32)  # [T, heads, dim]
    rope.rotate_half(x, cos, sin, out)
    return out


# ---------------------------------------------------------------- RMS norm


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray | None:
    """``x`` float32 [T, dim] or [T, heads, dim] normed over dim and scaled by ``weight`` [dim], in one compiled call.

    None where the compiled loops cannot run or the arrays are not of that kind: the caller keeps its numpy path.
    """
    if not (ready() and x.dtype == np.float32 and weight.dtype == np.float32 and x.ndim in (2, 3)):
        return None
    from kestrel_trio._kernels import norm

    rows = x if x.ndim == 3 else x[:, None, :]  # [T, heads, dim]
    flat = _unit_stride_span(rows)  # [span]
    if flat is None or not weight.flags.c_contiguous:
        return None
    out = np.empty(rows.shape, dtype=np.float32)  # [T, heads, dim]
    norm.rms_norm(flat, rows.strides[0] // 4, rows.strides[1] // 4, weight, np.float32(eps), out)
    return out.reshape(x.shape)


def _unit_stride_span(rows: np.ndarray) -> np.ndarray | None:
    """The 1-D float32 span of ``rows`` [T, heads, dim] from its first element to its last, or None.

    None unless dim is unit-stride and the other strides are whole, non-negative elements: then
    ``rows[a, h, i]`` is ``span[a * strides[0] + h * strides[1] + i]`` (strides in elements).
    """
    t, heads, dim = rows.shape
    strides = rows.strides
    if rows.size == 0 or (dim > 1 and strides[2] != 4) or any(s < 0 or s % 4 for s in strides[:2]):
        return None
    span = (t - 1) * (strides[0] // 4) + (heads - 1) * (strides[1] // 4) + dim  # elements
    return np.lib.stride_tricks.as_strided(rows, shape=(span,), strides=(4,))  # [span], a view


# ---------------------------------------------------------------- exponentials (softmax, SiLU)


def softmax_numerators(scores: np.ndarray) -> np.ndarray | None:
    """``scores`` float32 [..., S], C-contiguous, to e^(s - its row's max) in place; the row sums [..., 1].

    None (``scores`` untouched) where the compiled loops cannot run or the array is not of that kind.
    """
    if not (ready() and scores.dtype == np.float32 and scores.flags.c_contiguous and scores.size):
        return None
    from kestrel_trio._kernels import exp  # numba is imported: this only compiles or loads the loops

    rows = scores.reshape(-1, scores.shape[-1])  # [R, S], a view
    sums = np.empty(scores.shape[:-1] + (1,), dtype=np.float32)  # [..., 1]
    # The maxima in numpy, whose max vectorizes (exp.softmax_shifted says why): a row with a NaN gets NaN, and
    # the whole row's output is NaN, as its NaN sum made it before.
    exp.softmax_shifted(rows, rows.max(axis=1), sums.reshape(-1))
    return sums


def swiglu(gate_up: np.ndarray) -> np.ndarray | None:
    """silu(gate) * up, float32 [N, D], for ``gate_up`` float32 [N, 2D] (C-contiguous) holding gate, then up.

    None where the compiled loops cannot run or the array is not of that kind.
    """
    if not (ready() and gate_up.dtype == np.float32 and gate_up.flags.c_contiguous and gate_up.ndim == 2):
        return None
    from kestrel_trio._kernels import exp

    out = np.empty((gate_up.shape[0], gate_up.shape[1] // 2), dtype=np.float32)  # [N, D]
    exp.swiglu(gate_up, out)
    return out


def _whole_buffer(view: np.ndarray) -> np.ndarray | None:
    """The C-contiguous float32 [h, capacity, d] buffer whose prefix along axis 1 ``view`` is, or None."""
    base = view.base if view.base is not None else view
    if (isinstance(base, np.ndarray) and base.dtype == np.float32 and base.ndim == 3 and base.flags.c_contiguous
            and base.ctypes.data == view.ctypes.data and base.strides == view.strides
            and base.shape[0] == view.shape[0] and base.shape[2] == view.shape[2]):
        return base
    return None


def decode_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float,
                     run_shared: Callable | None = None, shares_of: Callable | None = None) -> np.ndarray | None:
    """One query's grouped attention, [n_heads * hd]: ``q`` float32 [n_heads, hd] over ``keys``, ``values``.

    ``keys``, ``values``: float32 [n_kv, total, hd], each a prefix of a C-contiguous buffer (a KV cache's).
    Scores are ``(q * scale) . k``. With ``run_shared`` and ``shares_of`` (kestrel_trio._model.matmul's), a
    long context's kv heads are shared among the product threads (from SHARED_DECODE_SCORES query-head x key
    scores). None where the compiled loops cannot run or the arrays are not of that kind.
    """
    cached = _cache_buffers(keys, values) if ready() and q.dtype == np.float32 and q.ndim == 2 else None
    if cached is None:
        return None
    from kestrel_trio._kernels import exp

    key_buffer, value_buffer, total = cached
    n_kv = keys.shape[0]
    out = np.empty(q.shape, dtype=np.float32)  # [n_heads, hd]
    scale = np.float32(scale)
    if run_shared is None or shares_of is None or total * q.shape[0] < SHARED_DECODE_SCORES:
        exp.decode_attention(q, key_buffer, value_buffer, total, 0, n_kv, scale, out)
    else:
        run_shared([lambda a=a, b=b: exp.decode_attention(q, key_buffer, value_buffer, total, a, b, scale, out)
                    for a, b in shares_of(n_kv)])
    return out.reshape(-1)


def decode_buffers(q: np.ndarray, stored: Sequence[tuple[np.ndarray, np.ndarray]],
                   out: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, int]] | None:
    """Per sequence of a batched decode step, its whole float32 key and value buffers and its key count.

    ``q`` [B, n_heads, hd] and ``out`` [B, n_heads, hd] must be C-contiguous float32, and each of ``stored``
    (keys, values [n_kv, total, hd]) a prefix of a KV cache's buffers; None otherwise, or where the compiled
    loops cannot run: the caller keeps its per-sequence path.
    """
    if not (ready() and q.dtype == np.float32 and q.ndim == 3 and q.flags.c_contiguous and out.flags.c_contiguous
            and out.dtype == np.float32 and out.shape == q.shape and len(stored) == q.shape[0]):
        return None
    buffers = [_cache_buffers(keys, values) for keys, values in stored]
    return None if any(cached is None for cached in buffers) else buffers


def _cache_buffers(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """The whole float32 buffers that one sequence's ``keys``, ``values`` [n_kv, total, hd] are prefixes of, and
    total; None if there are no keys or either is not such a prefix."""
    key_buffer, value_buffer = _whole_buffer(keys), _whole_buffer(values)
    if key_buffer is None or value_buffer is None or keys.shape[1] == 0:
        return None
    return key_buffer, value_buffer, keys.shape[1]


def decode_attentions(q: np.ndarray, buffers: Sequence[tuple[np.ndarray, np.ndarray, int]], scale: float,
                      out: np.ndarray, first: int, stop: int) -> None:
    """``out[i]`` [n_heads, hd] = ``q[i]``'s attention over ``buffers[i]`` (:func:`decode_buffers`), i in [first, stop).

    One compiled call a sequence and nothing else: the per-sequence checks of :func:`decode_attention`, its
    output array and the copy into the step's rows cost a short context more than the attention (Qwen3-0.6B's
    shapes, 8 sequences of 60 keys, 2-core Zen 5: 204 against 371 us a layer).
    """
    from kestrel_trio._kernels import exp

    scale = np.float32(scale)
    for i in range(first, stop):
        key_buffer, value_buffer, total = buffers[i]
        exp.decode_attention(q[i], key_buffer, value_buffer, total, 0, key_buffer.shape[0], scale, out[i])


# Query-head x key scores from which a decode step's attention is shared among the product threads: 16 heads over
# 256 keys of 128 dims, about 50 us on one thread on the 2-core Zen 5, where a hand-off costs 10-30 us. Measured
# there (Qwen3-0.6B's shapes, best / median of three step times in one process), 8 sequences of 64 keys: 77.6 /
# 78.1 ms from 4 Ki scores, 80.1 / 82.7 from 16 Ki (not shared), 83.1 / 86.2 never shared; 16 of 64: 120.3 /
# 122.0, 123.2 / 123.7, 127.8 / 132.5.
SHARED_DECODE_SCORES = 1 << 12
