"""The process-wide settings models are loaded with: BLAS and product threads, products, prefill precision.

Each ``set_*`` function sets what models loaded later take when ``load_model`` is given none of its own; a loaded
model keeps what it was loaded with. Also here: the C heap's reuse of freed temporaries (glibc's malloc), tuned
once per process when the first model is built. Part of the public model layer (:mod:`kestrel_trio.model`
re-exports the public names); it never imports trio.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any, Callable

from kestrel_trio._model import set_default_prefill_precision, set_default_products, set_product_threads
from kestrel_trio.errors import ModelLoadError

__all__ = ["set_blas_threads", "set_prefill_precision", "set_products"]

# The public model's one logger, whichever of its modules speaks: a logging set-up (or a test) that names
# "kestrel_trio.model" sees all of it, as before the module was split.
log = logging.getLogger("kestrel_trio.model")


@functools.cache
def _keep_freed_temporaries() -> None:
    """Have glibc's malloc keep freed multi-MiB temporaries for reuse (process-wide, once).

    A step's activations (a 256-row prefill chunk's are 1-6 MiB each) are
    allocated and freed hundreds of times a second. By default glibc maps
    each anew and unmaps it on free until a first large free raises its
    threshold, so every step pays page faults: a 128-token prefill ran at
    241 tok/s, against 295 once freed memory was reused. Elsewhere (no glibc)
    this does nothing.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # blocks up to 32 MiB come from the heap, and go back to it
    mallopt(_M_TRIM_THRESHOLD, 64 << 20)  # free heap kept at the top before it is returned to the system


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def set_blas_threads(threads: int) -> None:
    """Run numpy's BLAS on ``threads`` threads, process-wide, and kestrel's own product threads on as many in the
    models loaded later without ``blas_threads`` (a model loaded before keeps its own).

    BLAS's threads compute single-row (decode) and many-row (prefill)
    products. A batched decode step's products are instead shared among
    kestrel's threads, each multiplying its own stretch of a weight with
    BLAS set to one thread meanwhile (kestrel_trio._model.products.matmul), which
    avoids the packing OpenBLAS does for a few rows. Needs threadpoolctl.

    Raises:
        ModelLoadError: ``threads`` < 1, or threadpoolctl is not installed.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ModelLoadError(f"blas_threads must be a positive integer, got {threads!r}")
    blas, _ = _blas_at_start()
    setter = _any_thread_setter(blas)
    set_product_threads(threads, setter)
    _threadpoolctl().threadpool_limits(limits=threads, user_api="blas")
    if setter is not None:
        setter(threads)  # from a worker thread threadpoolctl's call alone leaves OpenBLAS's count as it was


def set_products(mode: str) -> None:
    """Which products quantized GGUF weights take in models loaded later without ``load_model(products=...)``.

    A loaded model keeps the mode it was loaded with (its own :class:`kestrel_trio._model.Backend`), whatever
    is set later or given to another model's load.

    "integer": each step's activations quantized to int8 per block of 32 with a
    float32 scale, as llama.cpp's, and multiplied with the weights' int8 blocks
    in integer arithmetic (aarch64's ``sdot``, x86-64's ``vpdpbusd`` or AVX2): a decode step reads the
    weights' bytes instead of expanding every weight to float32, about a
    ninth of the instructions a weight on a Cortex-A76 (Q8_0: 0.34 against 3.1,
    benchmarks/RESULTS.md, "The board, counted under qemu"). The logits differ from
    the exact ones by the activations' rounding. "exact": every weight
    expanded to float32 and multiplied in float32 (the reference; what
    ``--exact-products`` asks for). "auto" (the default): integer where this
    CPU has integer kernels of its own (aarch64; x86-64 with AVX2 or better), exact elsewhere. The integer
    products cover Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K; other forms stay exact.

    Raises:
        ModelLoadError: an unknown mode.
    """
    try:
        set_default_products(mode)
    except ValueError as error:
        raise ModelLoadError(str(error)) from None


def set_prefill_precision(precision: str) -> None:
    """How prefill chunks multiply float32 weights in models loaded later without their own: "fp32" (the default)
    or "bf16". A loaded model keeps the precision it was loaded with (``load_model(prefill_precision=...)``).

    "bf16" rounds the activations and weights of every product of more than
    32 rows (prefill chunks, and a Qwen3-VL's vision tower) to bf16 and
    multiplies them in AMX tiles, float32 sums (kestrel_trio._kernels.x86.tiles):
    on the 2-core Xeon a 512-token Qwen3-0.6B prefill ran 1.7-1.85x faster
    with fp32 weights and 2.4x with bf16 ones (read in place), its logits
    within about 0.5% of the float32 ones. It needs a CPU with AMX (Intel
    Sapphire Rapids and later) and Linux. Decode steps, speculative verify
    steps (at most 32 rows) and int8, int4 and GGUF weights stay as they are.

    Raises:
        ModelLoadError: an unknown precision, or "bf16" where AMX cannot run (saying why).
    """
    try:
        set_default_prefill_precision(precision)
    except ValueError as error:
        raise ModelLoadError(str(error)) from None
    if precision != "fp32":
        log.info("prefill products: %s in AMX tiles (float32 sums)", precision)


def _threadpoolctl():
    try:
        import threadpoolctl
    except ImportError:
        raise ModelLoadError("blas_threads needs the threadpoolctl package (pip install threadpoolctl)") from None
    return threadpoolctl


@functools.cache  # one ctypes handle per controller, not one per call
def _any_thread_setter(blas: Any) -> Callable[[int], None] | None:
    """A setter of numpy's BLAS thread count that works from any thread, or None without one BLAS.

    OpenBLAS's ``openblas_set_num_threads`` (threadpoolctl's setter) changes
    nothing when called from a thread other than the main one (measured with
    OpenBLAS 0.3.31: the count stayed 2 after a call for 1), and the engine
    runs its steps in a worker thread. ``openblas_set_num_threads_local``
    (0.3.27 and later), despite its name, sets the process-wide count from
    any thread, so it is used where it exists.
    """
    if blas is None:
        return None
    if getattr(blas, "internal_api", None) == "openblas":
        try:
            local = ctypes.CDLL(blas.filepath).openblas_set_num_threads_local
        except (OSError, AttributeError):
            local = None
        if local is not None:
            local.argtypes, local.restype = [ctypes.c_int], ctypes.c_int

            def set_count(count: int) -> None:
                local(count)  # returns the count before, which is not needed here

            return set_count
    return blas.set_num_threads


@functools.cache
def _blas_at_start() -> tuple[Any, int]:
    """threadpoolctl's controller of numpy's BLAS (None unless exactly one), and its thread count, read once.

    Read before kestrel first changes the count, so the count is BLAS's own
    default: one per core unless the environment says otherwise.
    """
    blas = [lib for lib in _threadpoolctl().ThreadpoolController().lib_controllers if lib.user_api == "blas"]
    return (blas[0] if len(blas) == 1 else None), max((lib.num_threads for lib in blas), default=1)
