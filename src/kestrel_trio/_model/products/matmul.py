"""Weight products ``x [N, in] @ W[out, in].T``: where a decoder step spends its time.

Theory of operation: a decode step reads every weight once, so its cost is
the time to stream the weights from memory, whatever the batch, as long as
the product itself costs no more than the read. By rows:

* 1 row (batch-1 decode) and more than 32 (prefill): one BLAS call, on
  BLAS's own threads, which hand work off in about a microsecond, or shared
  among the product threads (:func:`set_product_threads`), each multiplying
  a stretch of W's rows with one-thread BLAS: BLAS's threads spin-wait
  between calls and are several times slower beside any other busy process.
  Whichever has cost less lately runs (kestrel_trio._model.products.share_choice).
* 2-32 rows (a batched decode step): OpenBLAS packs a large weight before a
  small-M GEMM, which can cost 2-3x the read itself. The calls are timed
  once per model, on its weights (:func:`small_batch_call`): ``x @ W.T`` or ``W @ x.T``
  (run as 1 row is); "row_blocks": the product threads
  (:func:`set_product_threads`) each take a contiguous stretch of W's rows
  (the result's columns), view it as [rows/nb, nb, in] blocks and run one
  small GEMM per block with one-thread BLAS (BLAS is set to one thread while
  they run), which OpenBLAS's SkylakeX kernels compute without packing; or
  "compiled": the same stretches through kestrel_trio._kernels' float32
  product, which never packs on any CPU (each call in one thread:
  kestrel_trio._model.products.float_calls). Measured on 2 cores: 8 rows of
  Qwen3-0.6B's products cost 1.5x one row with row_blocks, against 2.5x
  for the best single GEMM; under the Haswell kernel, which packs every
  block, the compiled product is the one near that (:func:`_pick_small_batch_call`).
* A :class:`PackedMatrix` (bf16 bits, a GGUF's blocks, int8, int4), up to
  FUSED_MAX_ROWS rows (decode): compiled row products
  (kestrel_trio._kernels): each weight row is expanded from its compact form
  into a one-row buffer and multiplied at once with every activation row,
  the product threads each taking a stretch of rows. The weights are read
  once, compactly, and expanded once per step whatever the batch; numpy
  alone cannot fuse the two (its int8-to-float32 cast cost as much as the
  float32 product).
* A :class:`PackedMatrix` with more rows (prefill): the product threads
  share its chunks of rows (kestrel_trio._model.products.packed_chunks), each expanding its own into a scratch buffer
  (compiled: kestrel_trio._kernels.packed_expand) and multiplying it with
  BLAS as it is ready. One expansion serves every row of the batch.

Where numba is missing, numpy expands the chunks, and then quantized chunks
are not always expanded all the way. A part's integers come
with per-group scales (kestrel_trio._model.forms.dequant.Affine): ``w = scale * q
(+ offset)`` over groups of 16-256 weights of a row, or one scale per row
(int8). The product ``x @ w.T`` is then, exactly in algebra,
``sum_g scale_g * (x_g @ q_g.T) + offset_g * sum(x_g)``: with one scale per
row it is the integers' product with its columns scaled, one pass fewer over
the weights at any row count; with groups, for up to about packed_chunks.GROUPED_MAX_ROWS rows,
one batched product of every group's integers (a [groups, rows, 1] result
per activation row, 1/group the size of the weights) and a small reduction,
instead of a full pass multiplying the weights by their scales. The
products differ from those of the expanded weights only by float32 rounding
(the expanded weights themselves equal ggml's bit for bit: tests).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from kestrel_trio import _kernels
from kestrel_trio._model.products.jobs import matrix_job_rows
from kestrel_trio._model.products.backend import Backend, current, product_threads, set_product_threads
from kestrel_trio._model.forms.packed import Bf16Rows, Matrix, PackedMatrix
from kestrel_trio._model.products.float_calls import SMALL_BATCH_CALLS, product_into
from kestrel_trio._model.products.packed_chunks import Inputs, chunk_plan, run_chunks

__all__ = [
    "linear", "linear_packed", "linear_bf16", "set_product_threads", "product_threads", "run_shared", "shares_of",
    "small_batch_call", "set_small_batch_call", "choose_small_batch_call", "SMALL_BATCH_CALLS", "one_thread_blas",
    "warm_fused_products", "FUSED_MAX_ROWS",
]


def linear(x: np.ndarray, weight: Matrix, bias: np.ndarray | None = None) -> np.ndarray:
    """``x`` [N, in] times ``weight`` [out, in] transposed, plus ``bias`` [out]."""
    if x.ndim != 2:
        y = linear(x.reshape(-1, x.shape[-1]), weight, bias)  # [prod(...), out]
        return y.reshape(*x.shape[:-1], weight.shape[0])  # [..., out]
    if isinstance(weight, PackedMatrix):
        y = linear_packed(x, weight)  # [N, out]
    elif _on_tiles(x, weight):
        y = _kernels.tile_product(x, [weight], run_shared, shares_of)  # [N, out]
    elif _on_chunk_kernel(x, weight):
        y = _kernels.chunk_product(x, weight, run_shared, shares_of)  # [N, out]
    else:
        y = _product(x, weight, small_batch_call() if _is_small_batch(x.shape[0]) else "weight_right",
                     current())  # [N, out]
    if bias is not None:
        y += bias
    return y


def _on_tiles(x: np.ndarray, weight: np.ndarray) -> bool:
    """Whether this float32 product goes through bf16 tiles: the model's prefill precision bf16, prefill rows, a
    shape they take."""
    return weight.dtype == np.float32 and _tiles_take(x, weight)


def _tiles_take(x: np.ndarray, storage: np.ndarray) -> bool:
    """Whether the tiles multiply ``x`` by ``storage`` [rows, cols] (float32 or bf16 bits): bf16 prefill is the
    running model's (kestrel_trio._model.products.backend.current), and the rows and shape are the tiles'."""
    return (current().prefill_precision == "bf16" and x.shape[0] > SMALL_BATCH_ROWS[1] and storage.flags.c_contiguous
            and storage.shape[0] % _kernels.TILE_BLOCK_ROWS == 0 and storage.shape[1] % _kernels.TILE_K_STEP == 0)


# Rows up to which a float32 product takes the chunk kernel (_kernels.x86.float32.chunks) where it runs. Its
# rate stays about flat with the rows where BLAS's climbs: the 28 layers' products in turn on the 2-core Xeon,
# GFLOP/s, kernel against BLAS: 128 rows 323-325 against 255-260, 256 rows 318-326 against 304-312, 512 rows 316-317
# against 340-341 (2026-12-05). The default prefill chunk is 256 rows.
CHUNK_KERNEL_MAX_ROWS = 256


def _on_chunk_kernel(x: np.ndarray, weight: np.ndarray) -> bool:
    """Whether this float32 product of a prefill chunk goes through kestrel_trio._kernels.x86.float32.chunks.

    On Intel's AVX-512 CPUs (the kernel's docstring), from 33 rows to CHUNK_KERNEL_MAX_ROWS. The first call
    compiles or loads it (a model's load makes that call: Model.prepare_products).
    """
    return (SMALL_BATCH_ROWS[1] < x.shape[0] <= CHUNK_KERNEL_MAX_ROWS and weight.dtype == np.float32
            and weight.shape[0] >= _kernels.CHUNK_WEIGHT_ROWS and weight.shape[1] % _kernels.CHUNK_K_STEP == 0
            and weight.strides[1] == weight.itemsize and _kernels.enable_chunk_products() is None)


# Below this many weights a product is not worth a thread hand-off (tens of microseconds).
SHARE_MIN_ELEMENTS = 1 << 18
# Shares start on a multiple of this many weight rows, a multiple of every block size.
SHARE_ALIGN = 128


def _product(x: np.ndarray, weight: np.ndarray, call: str, backend: Backend) -> np.ndarray:
    """``x`` [N, in] @ ``weight`` [out, in].T in ``call``, shared among ``backend``'s product threads when that is
    cheaper (its share choices).

    "row_blocks" and "compiled" are always shared. A plain call runs on BLAS's own threads or
    shared (each product thread multiplying its stretch of W's rows with
    one-thread BLAS), whichever has cost less lately for products of its
    kind: BLAS's threads are faster on an idle machine and several times
    slower beside any other busy process (kestrel_trio._model.products.share_choice).
    """
    out = np.empty((x.shape[0], weight.shape[0]), dtype=np.float32)  # [N, out]
    threads = backend.threads
    if threads is None or weight.size < SHARE_MIN_ELEMENTS:
        product_into(x, weight, out, call)
        return out
    chooser = None if call in ("row_blocks", "compiled") else backend.share_choosers[_row_kind(x.shape[0])]
    shared = chooser is None or chooser.shared()
    started = time.perf_counter()
    if shared:
        bounds = _share_bounds(weight.shape[0], threads.count)
        threads.run([(lambda a=a, b=b: product_into(x, weight[a:b], out[:, a:b], call)) for a, b in bounds])
    else:
        product_into(x, weight, out, call)
    if chooser is not None:
        chooser.record(shared, time.perf_counter() - started, weight.size * x.shape[0])
    return out


def _row_kind(rows: int) -> str:
    return "one" if rows == 1 else "few" if rows <= SMALL_BATCH_ROWS[1] else "many"


def run_shared(tasks: list[Callable[[], None]]) -> None:
    """Run ``tasks`` on the running model's product threads with one-thread BLAS (one per thread), or in turn if
    there are none."""
    threads = current().threads
    if threads is None:
        for task in tasks:
            task()
    else:
        threads.run(tasks)


def one_thread_blas() -> contextlib.AbstractContextManager:
    """numpy's BLAS on one thread inside (process-wide), when the product threads manage its count.

    For products too small to share: waking BLAS's own threads for them costs
    more than they save (a thread hand-off each call), and far more when the
    process competes for the cores.
    """
    threads = current().threads
    return threads.one_thread_blas() if threads is not None else contextlib.nullcontext()


def shares_of(items: int) -> list[tuple[int, int]]:
    """[start, stop) ranges splitting ``items`` among the running model's product threads, as evenly as whole items
    allow."""
    threads = current().threads
    count = min(items, threads.count if threads is not None else 1) or 1
    edges = [items * k // count for k in range(count + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _is_small_batch(rows: int) -> bool:
    return SMALL_BATCH_ROWS[0] <= rows <= SMALL_BATCH_ROWS[1]


def _share_bounds(rows: int, shares: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) row ranges, SHARE_ALIGN-aligned, one per share (fewer if rows are few)."""
    step = -(-rows // shares // SHARE_ALIGN) * SHARE_ALIGN or SHARE_ALIGN
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


# float32 elements expanded per chunk: 512 KiB, which stays in L2 (with the part's own storage) between
# its expansion and its product. Measured on one core of the 2-core Xeon (AVX-512, busy machine), ns per
# weight of 64 Mi weights at 1 row, this size against 4 MiB: bf16 0.43-0.58 vs 0.67-0.78, int8 0.29-0.37 vs
# 0.37-0.41, Q8_0 0.37 vs 0.62, Q4_K 0.67 vs 1.16; 1 MiB chunks were within noise of this, 256 KiB worse
# for the quantized forms (bf16 was as fast).
UPCAST_CHUNK = 1 << 17


def linear_packed(x: np.ndarray, weight: PackedMatrix) -> np.ndarray:
    """``x`` [N, in] @ ``weight``.T [in, out]: compiled row products, or expanding UPCAST_CHUNK weights at a time.

    Up to FUSED_MAX_ROWS rows, every part of a form the compiled kernels
    know: :func:`_fused_product`. Otherwise rows are gathered across the
    matrix's parts into each chunk, so that q/k/v or gate/up make one BLAS
    product. With product threads, the chunks are shared out in contiguous stretches,
    each thread expanding into its own scratch buffer and writing its own
    columns. For float forms and int8 the chunk boundaries do not depend on
    the thread count, so neither does the result; grouped forms take bigger
    chunks when shared (:func:`_chunk_weights`), which may round differently
    in the last bits.
    """
    out_rows, width = weight.shape
    if x.ndim != 2:
        return linear_packed(x.reshape(-1, width), weight).reshape(*x.shape[:-1], out_rows)  # [..., out]
    if x.shape[0] <= FUSED_MAX_ROWS and _fused_forms(weight):
        return _fused_product(x, weight)
    if _packed_on_tiles(x, weight):
        return _tile_parts(x, weight)
    # Chosen here, before the chunks go to the product threads (which do not see the running model's backend).
    call = small_batch_call() if _is_small_batch(x.shape[0]) else "weight_right"
    out = np.empty((x.shape[0], out_rows), dtype=np.float32)  # [N, out]
    threads = current().threads
    chunks = chunk_plan(weight, max(1, _chunk_weights(weight, threads is not None) // width))
    inputs = Inputs(x)
    if threads is None or len(chunks) == 1:
        run_chunks(inputs, chunks, out, call)
        return out
    share = -(-len(chunks) // threads.count)  # contiguous shares: each thread streams its own stretch of the file
    threads.run([(lambda part=chunks[k : k + share]: run_chunks(inputs, part, out, call))
                 for k in range(0, len(chunks), share)])
    return out


linear_bf16 = linear_packed  # the bf16 residency's name for the same path


def _packed_on_tiles(x: np.ndarray, weight: PackedMatrix) -> bool:
    """Whether a packed product goes through bf16 tiles: bf16 prefill set, prefill rows, bf16 parts they take."""
    return all(isinstance(part, Bf16Rows) and _tiles_take(x, part.data) for part in weight.parts)


def _tile_parts(x: np.ndarray, weight: PackedMatrix) -> np.ndarray:
    """``x`` [N, in] @ ``weight``.T, each bf16 part read in place by the tile product (no expansion)."""
    return _kernels.tile_product(x, [part.data for part in weight.parts], run_shared, shares_of)  # [N, out]


# Activation rows up to which packed weights are multiplied row by row as they are expanded
# (kestrel_trio._kernels.portable.products) rather than expanded chunk by chunk for BLAS.
FUSED_MAX_ROWS = 16


def warm_fused_products(matrices: Sequence[PackedMatrix], mode: str) -> None:
    """Load the compiled products ``matrices`` will use in products ``mode`` now, then drop the compiler's pages.

    Each form's product is compiled at its first use (about a second, once
    per machine: numba caches the machine code on disk) or loaded from
    numba's cache (milliseconds), so that no request waits for it. Then the
    JIT compiler's code pages are handed back
    (kestrel_trio._kernels.release_compiler_pages): about 100 MiB of
    resident memory that only compiling and loading need.
    """
    forms = {part.form for matrix in matrices for part in matrix.parts if _kernels.compiled(part.form)}
    if forms:
        _kernels.prepare(forms, mode)


def _fused_forms(weight: PackedMatrix) -> bool:
    return all(_kernels.compiled(part.form) for part in weight.parts)


def _fused_product(x: np.ndarray, weight: PackedMatrix) -> np.ndarray:
    """``x`` [N, in] @ ``weight``.T with each weight row expanded once and used while hot, rows shared by thread.

    Each product thread takes a contiguous stretch of the matrix's rows (the
    result's columns), across its parts, so it streams its own stretch of
    the storage once. The products' mode is the running model's (read here, not in the product threads, which
    do not see it).
    """
    backend = current()
    x = np.ascontiguousarray(x, dtype=np.float32)  # [N, in]
    out = np.empty((x.shape[0], weight.shape[0]), dtype=np.float32)  # [N, out]
    runs, first = [], 0  # (the part's product, first column, last column + 1)
    for part, product in zip(weight.parts, _part_products(weight, backend)):
        runs.append((product, first, first + part.rows))
        first += part.rows
    # Integer products (aarch64's default): x quantized once for every part and thread, not once a call.
    quantized = _kernels.quantize_activations(x, weight.forms, backend.products)

    def stretch(start: int, stop: int) -> None:
        for product, lo, hi in runs:
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                product(x, a - lo, b - lo, out[:, a:b], quantized)

    threads = backend.threads
    if threads is None or weight.shape[0] * weight.shape[1] < SHARE_MIN_ELEMENTS:
        stretch(0, weight.shape[0])
        return out
    # every part this CPU's own integer kernel: shared as compiled jobs (kestrel_trio._model.products.jobs)
    rows = None
    if quantized is not None and threads.takes_jobs:
        rows = matrix_job_rows(weight, backend.products, threads.count)
    if rows is not None:
        xq, xd, xs = quantized
        threads.run_jobs(rows.table_for((xq, xd, xd if xs is None else xs), out))
    else:
        threads.run([(lambda a=a, b=b: stretch(a, b)) for a, b in _share_bounds(weight.shape[0], threads.count)])
    return out


def _part_products(weight: PackedMatrix, backend: Backend) -> tuple[_kernels.PartProduct, ...]:
    """Each part's compiled product in ``backend``'s products mode by its kernel plan: resolved at the matrix's
    first product in that mode and kept with it (``weight.kernels``), not looked up in the kernels' dispatch at
    every call. Resolved again where the plan differs (a backend without one reads the host's when resolving)."""
    found = weight.kernels.get(backend.products)
    if found is None or found[0] is not backend.plan:
        products = tuple(_kernels.PartProduct(*part.kernel_args(), backend.products, backend.plan)
                         for part in weight.parts)
        found = weight.kernels[backend.products] = (backend.plan, products)  # threads may both make it: harmless
    return found[1]


def _chunk_weights(weight: PackedMatrix, shared: bool) -> int:
    """Weights expanded per chunk, by what the parts cost per call and whether threads share the product.

    Per row scaled parts (int8) expand in one cast: twice UPCAST_CHUNK still
    stays in L2 and halves the calls (one core, 1 row: 165 ms a Qwen3-0.6B
    step against 172 ms). Grouped parts (a GGUF's blocks, int4) take dozens
    of short numpy calls a chunk, and two threads making them contend for
    the GIL: shared, they get four times UPCAST_CHUNK (Q8_0 218 ms a step
    against 265 ms, Q4_K 484 against 738, two threads), alone the plain size
    (Q8_0 251 ms against 319, Q4_K 445 against 599, one thread).
    """
    forms = {p.scaling for p in weight.parts}
    if forms == {"row"}:
        return UPCAST_CHUNK * 2
    return UPCAST_CHUNK * 4 if shared and "group" in forms else UPCAST_CHUNK


# Batch sizes of a batched decode step, for which the calls (float_calls.SMALL_BATCH_CALLS) are timed.
SMALL_BATCH_ROWS = (2, 32)


def small_batch_call() -> str:
    """How the running model's 2-32-row products run (outside any model: the defaults'), one of SMALL_BATCH_CALLS.

    Chosen on a model's own weights when it loads (:func:`choose_small_batch_call`);
    before that, a first small product times the calls on stand-in weights.

    "weight_left" (``W @ x.T``) and "weight_right" (``x @ W.T``) are one BLAS
    call on BLAS's own threads; "row_blocks" is one small GEMM per block of
    W's rows (float_calls.block_rows), shared among the product threads;
    "compiled" is kestrel_trio._kernels' float32 product (four weight rows
    by four activation rows a pass), shared the same way, where numba can
    be imported. Each is timed as :func:`linear` runs it.
    """
    backend = current()
    choice = backend.small_batch
    if choice.call is None:
        with choice.lock:
            if choice.call is None:
                choice.call, choice.source, choice.timed_bytes = _time_small_batch_calls(backend), "synthetic", 0
    return choice.call


def set_small_batch_call(call: str | None) -> None:
    """Force the running model's 2-32-row call (outside any model: the defaults'; one of SMALL_BATCH_CALLS), or
    None to time it again on next use."""
    if call is not None and call not in SMALL_BATCH_CALLS:
        raise ValueError(f"unknown small-batch call {call!r}")
    if call == "compiled" and not _kernels.ready():
        raise ValueError(f"the compiled small-batch call cannot run here: {_kernels.unavailable_reason()}")
    choice = current().small_batch
    with choice.lock:
        choice.call, choice.source, choice.timed_bytes = call, ("forced" if call is not None else "none"), 0


def choose_small_batch_call(sample: Sequence[np.ndarray]) -> str:
    """Time the small-batch calls on ``sample``, float32 weights [out, in] of the running model itself, and keep
    the fastest as its call (kestrel_trio._model.products.backend: each model has its own).

    Unless a call was forced (:func:`set_small_batch_call`) or chosen on a
    sample at least as large: a choice timed on stand-in weights at a first
    small product, or on a smaller sample before, is replaced. A sample of the
    model's own projections is what its decode steps multiply (the best call
    depends on the shapes and the BLAS kernel); a few hundred MiB, beyond L3,
    keeps the weights cold as in a step.
    """
    nbytes = sum(w.nbytes for w in sample)
    backend = current()
    choice = backend.small_batch
    with choice.lock:
        if sample and (choice.call is None or choice.source == "synthetic"
                       or (choice.source == "sample" and nbytes > choice.timed_bytes)):
            # A second model of the same shapes, dtypes and thread count takes the first one's timed call: the
            # same checkpoint loaded twice in one process then computes the same logits bit for bit (the calls
            # add in different orders), and the timing would measure the same thing again.
            key = (tuple((w.shape, w.dtype.str) for w in sample), backend.thread_count)
            with _timed_lock:
                call = _timed_calls.get(key)
                if call is None:
                    call = _timed_calls[key] = _time_small_batch_calls(backend, sample)
            choice.call, choice.source, choice.timed_bytes = call, "sample", nbytes
    return small_batch_call()


# The small-batch call timed on each sample's shapes, dtypes and thread count: a fact of this machine, as the
# kernel plan is, shared by the models of a process (choose_small_batch_call).
_timed_calls: dict[tuple, str] = {}
_timed_lock = threading.Lock()


def _time_small_batch_calls(backend: Backend, weights: Sequence[np.ndarray] | None = None, rounds: int = 3) -> str:
    """The fastest call on ``weights`` (None: stand-ins) shared among ``backend``'s product threads."""
    if weights is None:  # 96 MiB shaped like a decoder's larger projections, beyond L3
        weights = [np.full((6144, 1024), 0.01, dtype=np.float32) for _ in range(4)]  # 4 x [out, in]
    inputs = {w.shape[1]: np.full((8, w.shape[1]), 0.5, dtype=np.float32) for w in weights}  # [8, in] by width
    best = dict.fromkeys(SMALL_BATCH_CALLS, float("inf"))
    calls = [c for c in SMALL_BATCH_CALLS if c != "compiled" or _compiled_float_products()]
    for call in calls:
        # One untimed pass first: after calls on BLAS's own threads, those threads spin for
        # ~0.1 s and slow a shared call meanwhile, which steady batched decoding never sees.
        for timed in [False] + [True] * rounds:
            started = time.perf_counter()
            for w in weights:
                _product(inputs[w.shape[1]], w, call, backend)
            if timed:
                best[call] = min(best[call], time.perf_counter() - started)
    return _pick_small_batch_call(best)


def _pick_small_batch_call(seconds: dict[str, float]) -> str:
    """The call to keep, given each call's best time on the sample (inf: not timed)."""
    plain = min(("weight_left", "weight_right"), key=seconds.__getitem__)
    # The compiled products (kestrel_trio._kernels: four weight rows by four activation rows a pass, never
    # packed) measured as fast as row_blocks at 8 rows and faster at 16 under SkylakeX (Qwen3-0.6B's shapes,
    # bare forward on 2 threads: 16 streams 6.95x batch 1 against 6.40x), and faster at both under Haswell,
    # which packs every block (8: 4.67x against 3.78x; 16: 6.30x against 4.63x). A sample of 8 rows timed
    # once does not show the 16-row gain, so they are kept unless row_blocks is clearly faster.
    shared = "compiled" if seconds["compiled"] <= SHARED_SLACK * seconds["row_blocks"] else "row_blocks"
    # A sample timed once at load understates the shared calls: on Qwen3-0.6B under SkylakeX row_blocks
    # timed 19-23 ms against 17-24 ms for W @ x.T, where a whole decode step's products take 78 against
    # 135 ms. So a shared call is kept unless a plain call is clearly faster.
    return shared if seconds[shared] <= SHARED_SLACK * seconds[plain] else plain


# How much slower than the call it is weighed against a shared call may time on the sample and still be chosen.
SHARED_SLACK = 1.25


def _compiled_float_products() -> bool:
    """Whether the compiled float32 product can run (loading it, and then dropping the compiler's pages)."""
    if not _kernels.ready():
        return False
    _kernels.prepare({"F32"}, "exact")  # F32 has no integer product: the same in every mode
    return True
