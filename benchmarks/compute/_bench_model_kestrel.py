"""bench_model.py's kestrel sides, each run in a fresh subprocess: load, prefill, decode (bare forward and engine),
the two weight residencies, two processes sharing one mapped checkpoint, and the small-batch GEMM call shapes.

Times are seconds from ``time.perf_counter``, rates tokens per second, memory bytes. The prefill products and the
GEMM shapes call matmul's private product paths themselves (tests/test_architecture.py's KERNEL_BENCHMARKS).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

from _bench_common import AVX2_MACHINE_ENV, best_of, blas_description, read_bandwidth, status_bytes
from _bench_model_plan import BATCHES, PAIRS, PREFILL_LENGTHS, SHORT_PROMPT, median, prompt


def kestrel_side(folder: Path, args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    from kestrel_trio import load_model
    from kestrel_trio._model import forward

    model = load_model(folder, blas_threads=args.threads, weights="fp32")
    model.logits([1, 2, 3])
    result = {"ready_s": time.perf_counter() - started, "rss_after_load": status_bytes("VmRSS"),
              "blas": blas_description()}
    result.update(kestrel_prefill(model, args))
    steps = 16 if args.quick else 128
    result["decode_1"] = bare_decode(model, forward, 1, steps)
    result["engine_1"] = engine_decode(model, 1, 16 if args.quick else args.batch_tokens)
    for batch in BATCHES:
        result.update(bare_and_engine(model, forward, batch, 8 if args.quick else args.batch_tokens,
                                      1 if args.quick else PAIRS))
    result["peak_rss"] = status_bytes("VmHWM")
    result["bandwidth"] = max(read_bandwidth(0.5).values())  # again, next to the decode runs (after the peak RSS)
    from kestrel_trio._model import small_batch_call

    result["small_batch_call"] = small_batch_call()  # the one choice, made at load for the bare forward and the engine
    return result


def bare_and_engine(model, forward, batch: int, tokens: int, pairs: int) -> dict:
    """``batch`` streams through the bare forward and through the engine, ``pairs`` times each, alternated.

    Memory bandwidth here can move by a third between runs a few seconds
    apart, so engine / bare is taken pair by pair (each pair's two runs
    back to back, the first of the pair alternating), and the median of the
    pairs' ratios is the figure; the rates are each side's best run.
    """
    bare, engine, ratios, own = [], [], [], []
    for pair in range(pairs):
        first, second = (("bare", "engine"), ("engine", "bare"))[pair % 2]
        rates = {}
        for way in (first, second):
            if way == "bare":
                rates[way] = bare_decode(model, forward, batch, tokens)
            else:
                rates[way], split = engine_decode(model, batch, tokens, split=True)
                own.append(split)
        bare.append(rates["bare"])
        engine.append(rates["engine"])
        ratios.append(rates["engine"] / rates["bare"])
    return {f"bare_{batch}": max(bare), f"engine_{batch}": max(engine), f"pair_ratios_{batch}": ratios,
            f"engine_split_{batch}": own}


def bare_decode(model, forward, batch: int, steps: int) -> float:
    """Aggregate greedy decode tok/s of ``batch`` sequences stepped together through forward()."""
    import numpy as np

    caches = [model.new_cache() for _ in range(batch)]
    tokens = np.array([int(np.argmax(model.prefill(c, prompt(SHORT_PROMPT, i)))) for i, c in enumerate(caches)])  # [B]
    ones = [1] * batch
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        positions = np.array([c.length for c in caches], dtype=np.int64)  # [B]
        logits = forward(model.decoder, tokens, positions, caches, ones)  # [B, vocab]
        tokens = logits.argmax(axis=-1)  # [B]
        times.append(time.perf_counter() - started)
    return batch / median(times)


def engine_decode(model, batch: int, new_tokens: int, split: bool = False):
    """Aggregate decode tok/s of ``batch`` concurrent generations through the engine.

    From the median time between two tokens of one stream once every stream
    has its first token (all prefills done): the decode step rate alone.
    With ``split``, also (median step ms, median ms of the step's forward
    pass): the engine's own share of a step, measured inside this one run,
    so no other process's load between two runs is in it.
    """
    import functools

    import trio

    from kestrel_trio import EngineLimits, GenerationRequest, SamplingParams, run_engine
    from kestrel_trio.text import Tokenizer

    if model.tokenizer is None:
        model.tokenizer = Tokenizer.from_demo()  # the engine detokenizes; random weights need some vocabulary
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    limits = EngineLimits(max_batch=max(BATCHES), max_queued=2 * max(BATCHES))
    stamps: list[list[float]] = [[] for _ in range(batch)]

    async def stream(engine, index: int) -> None:
        request = GenerationRequest(prompt_ids=tuple(prompt(SHORT_PROMPT, 100 + index)), params=params)
        async with engine.open_generation(request) as deltas:
            async for _ in deltas:
                stamps[index].append(time.perf_counter())

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            engine = await nursery.start(functools.partial(run_engine, model, limits=limits))
            async with trio.open_nursery() as streams:
                for index in range(batch):
                    streams.start_soon(stream, engine, index)
            nursery.cancel_scope.cancel()

    forwards: list[tuple[float, float, int]] = []  # (started, seconds, rows) of each of the engine's forward passes
    with timed_forward(model, forwards) if split else contextlib.nullcontext():
        trio.run(run)
    start = max(s[0] for s in stamps)  # every prefill done: only decode steps from here
    gaps = [b - a for a, b in zip(stamps[0], stamps[0][1:]) if a >= start]  # one engine step each
    rate = batch / median(gaps)
    if not split:
        return rate
    decode_forwards = [seconds for began, seconds, rows in forwards if began >= start and rows == batch]
    return rate, (1e3 * median(gaps), 1e3 * median(decode_forwards))


@contextlib.contextmanager
def timed_forward(model, log: list):
    """``model.step_batch`` timed while inside: each call appends (start, seconds, rows) to ``log``.

    Only for this benchmark's split of an engine step: the forward pass the
    engine runs (it steps the model through Model.step_batch) is that very
    method, wrapped on this model, so what is not in it is the engine's own
    (sampling, detokenizing, the thread hand-off, delivery).
    """
    real = model.step_batch

    def step_batch(token_ids, *args, **kwargs):
        began = time.perf_counter()
        try:
            return real(token_ids, *args, **kwargs)
        finally:
            log.append((began, time.perf_counter() - began, len(token_ids)))

    model.step_batch = step_batch
    try:
        yield
    finally:
        del model.step_batch  # the class's method again


def residency_side(folder: Path, args: argparse.Namespace) -> dict:
    """One weights mode on the bf16 checkpoint: RSS after load, time to ready, decode at batch 1 and 8."""
    started = time.perf_counter()
    from kestrel_trio import load_model
    from kestrel_trio._model import forward

    model = load_model(folder, blas_threads=args.threads, weights=args.weights)
    model.logits([1, 2, 3])
    result = {"ready_s": time.perf_counter() - started, "rss_after_load": status_bytes("VmRSS"),
              "pss_after_load": pss_bytes(), "mode": model.weights_mode}
    result["decode_1"] = bare_decode(model, forward, 1, 16 if args.quick else 64)
    result["bare_8"] = bare_decode(model, forward, 8, 8 if args.quick else 32)
    result["peak_rss"] = status_bytes("VmHWM")
    result.update(kestrel_prefill(model, args))
    return result


def share_side(folder: Path, args: argparse.Namespace) -> dict:
    """Load in bf16 mode, wait until the peer process has loaded too, then report RSS and PSS."""
    from kestrel_trio import load_model

    model = load_model(folder, weights="bf16")
    model.logits([1, 2, 3])
    (args.barrier / str(os.getpid())).touch()
    deadline = time.monotonic() + 120
    while len(list(args.barrier.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    result = {"rss": status_bytes("VmRSS"), "pss": pss_bytes()}
    (args.barrier / f"{os.getpid()}.measured").touch()
    while len(list(args.barrier.glob("*.measured"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # stay mapped until the peer has measured too
    return result


def pss_bytes() -> int:
    """Proportional set size: shared pages (the mapped checkpoint) split between the processes mapping them."""
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def kestrel_prefill(model, args: argparse.Namespace) -> dict:
    """Prefill tok/s of each length, float32, then with ``prefill_precision="bf16"`` (AMX tiles) or why not."""
    import attrs

    from kestrel_trio._kernels import enable_tiles

    prompts = {n: prompt(n, n) for n in PREFILL_LENGTHS[: 1 if args.quick else 2]}

    def rates(key: str) -> dict:
        return {f"{key}_{n}": n / best_of(3, lambda: model.prefill(model.new_cache(), ids))
                for n, ids in prompts.items()}

    result = rates("prefill")
    result.update(kestrel_prefill_products(model, prompts))
    if os.environ.get("NUMBA_CPU_NAME") == AVX2_MACHINE_ENV["NUMBA_CPU_NAME"]:  # --avx2 (run_as_avx2_machine)
        return {**result, "tiles": "--avx2: an AVX2-only CPU has no AMX tiles"}
    reason = enable_tiles()
    if reason is not None:
        return {**result, "tiles": reason}
    decoder = model.decoder  # the same weights, with the model's settings but bf16 prefill (a model keeps its own)
    model.decoder = attrs.evolve(decoder, backend=attrs.evolve(decoder.backend, prefill_precision="bf16"))
    try:
        return {**result, **rates("prefill_bf16")}
    finally:
        model.decoder = decoder


def kestrel_prefill_products(model, prompts: dict) -> dict:
    """Seconds of a float32 prefill's layer products alone, in the prefill's chunks, and their GFLOP.

    Every layer's products on every row of a chunk, but the last layer's past q/k/v, which a prefill runs on
    the returned row alone (forward trims it). lm_head's row, attention, norms and the rest are left out: this
    is the floor the products put under kestrel's prefill, set beside PyTorch's whole prefill in
    :func:`check_targets`. Each product is the call the prefill makes (:func:`chunk_product`).
    """
    import numpy as np

    from kestrel_trio.model import DEFAULT_PREFILL_CHUNK

    layers = model.decoder.weights.layers
    matrices = layer_matrices(layers[:-1]) + [layers[-1].attn.qkv_proj]  # the last layer's rest: one row
    rng = np.random.default_rng(2)
    result = {}
    for n in prompts:
        chunks = [min(DEFAULT_PREFILL_CHUNK, n - start) for start in range(0, n, DEFAULT_PREFILL_CHUNK)]
        xs = {(rows, m.shape[1]): rng.standard_normal((rows, m.shape[1]), dtype=np.float32)  # [rows, in]
              for rows in set(chunks) for m in matrices}
        calls = {rows: chunk_product(model, rows) for rows in set(chunks)}

        def products(chunks=chunks, xs=xs, calls=calls) -> None:
            # Each product's output dropped at once, as in a prefill: kept in a list, every one was new memory
            # (page faults), and the products measured 12-14% slower than the same ones inside a prefill.
            for rows in chunks:
                for m in matrices:
                    calls[rows](xs[rows, m.shape[1]], m)

        seconds = best_of(3, products)
        result[f"products_{n}_s"] = seconds
        weights = sum(m.shape[0] * m.shape[1] for m in matrices)  # a packed matrix has a shape, not a .size
        result[f"products_gflop_{n}"] = 2 * n * weights / 1e9
    return result


def chunk_product(model, rows: int):
    """``call(x, m)``: the product a prefill chunk of ``rows`` tokens makes of ``x`` [rows, in] and weight ``m``.

    Where its layers run packed (kestrel_trio._model.decoder.packed_layers): the q/k/v product packed in and
    gathered into rows, o_proj's packed by each thread from rows, gate/up's and down's packed in and out (inputs
    packed here, untimed, as a prefill keeps them packed); else ``linear``.
    """
    from kestrel_trio._kernels.x86.float32 import packed_rows
    from kestrel_trio._model.products.matmul import linear, run_shared, shares_of
    from kestrel_trio._model.decoder.packed_layers import takes_packed

    cache = model.new_cache()
    cache.reserve(rows)
    layers = model.decoder.weights.layers
    if not takes_packed(layers, [cache], [rows]):
        return linear
    blocks = -(-rows // packed_rows.LANES)
    qkv = {id(layer.attn.qkv_proj) for layer in layers}
    o_proj = {id(layer.attn.o_proj) for layer in layers}
    packed = {}

    def call(x, m) -> None:
        if id(m) in o_proj:
            packed_rows.product_of_rows(x, blocks, m, run_shared, shares_of)
            return
        if id(x) not in packed:
            packed[id(x)] = packed_rows.pack(x, blocks)  # [blocks, in, 32]
        product = packed_rows.product_rows if id(m) in qkv else packed_rows.product
        product(packed[id(x)], m, run_shared, shares_of)
    return call


def layer_matrices(layers) -> list:
    """The weight matrices of ``layers`` in kestrel's fp32 residency (fused qkv and gate/up), layer by layer."""
    return [m for layer in layers
            for m in (layer.attn.qkv_proj, layer.attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]


def gemm_side(folder: Path, args: argparse.Namespace) -> dict:
    """Cost of one [rows, 1024] x [1024, 3072] product in each call shape, cold weights (us).

    The plain calls run on BLAS's own ``--threads`` threads; "linear" is what
    kestrel runs (for 2-32 rows: shared among its own threads, one-thread BLAS
    each, in the call it timed), and "row_blocks, 1 thread" is one such thread's call alone.
    """
    import numpy as np

    from kestrel_trio._model.products import float_calls, matmul
    from kestrel_trio.model import set_blas_threads

    set_blas_threads(args.threads)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((3072, 1024), dtype=np.float32) for _ in range(24)]  # 24 x [out, in], > L3
    transposed = [np.ascontiguousarray(w.T) for w in weights]  # 24 x [in, out]
    table = {"blas": blas_description(), "small_batch_call": matmul.small_batch_call()}
    for rows in (1, 4, 8, 16):
        x = rng.standard_normal((rows, 1024), dtype=np.float32)  # [rows, in]
        xt = np.ascontiguousarray(x.T)  # [in, rows]
        out, out_t = np.empty((rows, 3072), np.float32), np.empty((3072, rows), np.float32)
        with matmul.one_thread_blas():
            blocks = cold_cost(lambda w: float_calls.row_blocks_into(x, w, out), weights)
        table[rows] = {
            "x @ W.T  (W [out,in])": cold_cost(lambda w: np.matmul(x, w.T, out=out), weights),
            "x @ Wt   (Wt [in,out])": cold_cost(lambda w: np.matmul(x, w, out=out), transposed),
            "W @ x.T  (W [out,in])": cold_cost(lambda w: np.matmul(w, xt, out=out_t), weights),
            "row_blocks, 1 thread": blocks,
            "linear": cold_cost(lambda w: matmul.linear(x, w), weights),
        }
    del weights, transposed
    table["step"] = step_products(folder)
    return table


def step_products(folder: Path) -> dict:
    """Milliseconds for all of one decode step's weight products (every layer and lm_head), by call and rows."""
    import numpy as np

    from kestrel_trio import load_model
    from kestrel_trio._model.products import matmul

    w = load_model(folder, weights="fp32").decoder.weights
    matrices = layer_matrices(w.layers) + [w.lm_head]
    rng = np.random.default_rng(1)
    table = {"small_batch_call": matmul.small_batch_call()}
    for rows in (1, 8, 16):
        xs = {width: rng.standard_normal((rows, width), dtype=np.float32) for width in {m.shape[1] for m in matrices}}
        linear = best_of(5, lambda: [matmul.linear(xs[m.shape[1]], m) for m in matrices]) * 1e3
        table[rows] = {  # linear first: BLAS's own threads spin for ~0.1 s after a call and slow what follows
            "x @ W.T": best_of(5, lambda: [xs[m.shape[1]] @ m.T for m in matrices]) * 1e3,
            "W @ x.T": best_of(5, lambda: [m @ xs[m.shape[1]].T for m in matrices]) * 1e3,
            "linear": linear,
        }
    return table


def cold_cost(call, matrices, rounds: int = 6) -> float:
    """Median-low (25th percentile) microseconds of ``call(m)`` cycling through matrices too big for the cache."""
    import numpy as np

    times = []
    for _ in range(rounds):
        for m in matrices:
            started = time.perf_counter()
            call(m)
            times.append(time.perf_counter() - started)
    return float(np.percentile(times, 25)) * 1e6
