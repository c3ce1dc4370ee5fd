"""kestrel-trio next to transformers (PyTorch eager, fp32) on the same Qwen3-0.6B-shaped weights.

Usage:
    python benchmarks/compute/bench_model.py [--quick] [--threads N] [--rounds N] [--keep-openblas-env] [--avx2]
                                             [--gemm]

Builds once (in ~/.cache/kestrel-trio-bench/) a checkpoint with Qwen3-0.6B's
exact shapes and random weights, written by transformers in fp32 (and a bf16
copy of the same weights for the residency comparison). Then each side runs in
its own fresh subprocess, so peak RSS (VmHWM) is not shared, with the same
thread count (numpy's BLAS threads = torch.set_num_threads): load time,
prefill tok/s for 128- and 512-token prompts (best of 3; again with bf16
products where the CPU has AMX: kestrel's ``prefill_precision="bf16"`` and
PyTorch's ``set_float32_matmul_precision("medium")``), decode tok/s at
batch 1, and aggregate decode tok/s with 4 and 8 concurrent sequences (kestrel
both through the engine and through the bare forward; PyTorch through a
batched decode loop with its KV cache). Decode rates come from the median step
time, and the sides alternate for --rounds rounds keeping each figure's best,
so that bursts of load from other processes on a shared machine do not decide
the result. engine / bare forward is the median ratio of PAIRS alternated
bare-forward and engine runs per batch size and round, each pair back to back
in one process (two bests taken minutes apart would mix two bandwidths); each
engine run also splits its median step into the forward pass and the rest
(the engine's own time: sampling, detokenizing, thread hand-off, delivery),
a figure that other processes' load between runs cannot move. It
also measures the machine's memory read bandwidth with numpy and reports kestrel's batch-1 decode as a fraction of bandwidth / bytes of
weights read per token, and (bf16 checkpoint) kestrel's two weight residencies
side by side.

This machine may set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (for old OpenBLAS
builds); the benchmark re-executes itself without them unless
--keep-openblas-env, and prints the kernel OpenBLAS actually ran. ``--avx2``
makes a CPU with AVX-512 run, on both sides, the code an AVX2-only CPU would
(OpenBLAS's Haswell kernels, numba's haswell target, PyTorch's AVX2 ATen,
MKL and oneDNN): the header and the PyTorch BLAS line print what ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _bench_common import (  # noqa: E402
    AVX2_MACHINE_ENV, best_of, blas_description, blas_threads, compiled_kernels_description, cpu_vector_flags,
    fma_peak, openblas_overrides_note, read_bandwidth, run_as_avx2_machine, run_without_openblas_overrides,
    status_bytes,
)
from _checkpoints import QWEN3_0_6B  # noqa: E402

CACHE = Path.home() / ".cache" / "kestrel-trio-bench"
PREFILL_LENGTHS = (128, 512)
BATCHES = (4, 8, 16)
SHORT_PROMPT = 8  # tokens before a decode measurement
PAIRS = 4  # alternated bare-forward and engine runs per batch size, for engine / bare


# ---------------------------------------------------------------- checkpoint


def build_checkpoint(folder: Path, dtype: str) -> None:
    """Write the checkpoint with transformers (seeded random init) unless it is already there."""
    if (folder / "config.json").exists():
        return
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    started = time.perf_counter()
    fields = {k: v for k, v in QWEN3_0_6B.items() if k not in ("architectures", "torch_dtype")}
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**fields)).eval()
    partial = folder.with_name(folder.name + ".partial")  # renamed when complete: a torn build is never reused
    shutil.rmtree(partial, ignore_errors=True)
    model.to(dtype=getattr(torch, dtype)).save_pretrained(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    print(f"built {folder} with transformers in {time.perf_counter() - started:.1f} s", flush=True)


def weight_bytes_per_token() -> int:
    """fp32 bytes of weights one batch-1 decode step reads: every matrix plus lm_head (not embedding lookups)."""
    from kestrel_trio._model import config_from_dict, expected_shapes

    config = config_from_dict(QWEN3_0_6B)
    shapes = expected_shapes(config)
    total = sum(math.prod(s) for name, s in shapes.items() if len(s) == 2)
    if not config.tie_word_embeddings:
        total -= math.prod(shapes["model.embed_tokens.weight"])  # only looked up by row
    return 4 * total


# ---------------------------------------------------------------- kestrel side


def prompt(length: int, seed: int) -> list[int]:
    """Token ids inside the real Qwen3 tokenizer's vocabulary (the engine detokenizes them)."""
    import numpy as np

    return np.random.default_rng(seed).integers(1000, 150000, size=length).tolist()


def kestrel_side(folder: Path, args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    from kestrel_trio import load_model
    from kestrel_trio._model import forward

    model = load_model(folder, blas_threads=args.threads, weights="fp32")
    model.logits([1, 2, 3])
    result = {"ready_s": time.perf_counter() - started, "rss_after_load": status_bytes("VmRSS"), "blas": blas_description()}
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


def median(values: list[float]) -> float:
    """The median: a step rate that a burst of load from other processes does not drag down."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


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

    import kestrel_trio.engine.step as engine_step
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
    with timed_forward(engine_step, forwards) if split else contextlib.nullcontext():
        trio.run(run)
    start = max(s[0] for s in stamps)  # every prefill done: only decode steps from here
    gaps = [b - a for a, b in zip(stamps[0], stamps[0][1:]) if a >= start]  # one engine step each
    rate = batch / median(gaps)
    if not split:
        return rate
    decode_forwards = [seconds for began, seconds, rows in forwards if began >= start and rows == batch]
    return rate, (1e3 * median(gaps), 1e3 * median(decode_forwards))


@contextlib.contextmanager
def timed_forward(module, log: list):
    """``module.forward`` timed while inside: each call appends (start, seconds, rows) to ``log``.

    Only for this benchmark's split of an engine step: the forward pass the
    engine runs is the very function, wrapped, so what is not in it is the
    engine's own (sampling, detokenizing, the thread hand-off, delivery).
    """
    real = module.forward

    def forward(decoder, token_ids, *args, **kwargs):
        began = time.perf_counter()
        try:
            return real(decoder, token_ids, *args, **kwargs)
        finally:
            log.append((began, time.perf_counter() - began, len(token_ids)))

    module.forward = forward
    try:
        yield
    finally:
        module.forward = real


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


def measure_sharing(folder: Path, args: argparse.Namespace) -> None:
    """Two bf16-mode processes on one checkpoint at once: their RSS and PSS (the mapped weights count once in PSS)."""
    import tempfile

    with tempfile.TemporaryDirectory() as barrier:
        command = [sys.executable, __file__, "--side", "share", "--folder", str(folder), "--barrier", barrier]
        children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
        results = [json.loads(child.communicate(timeout=300)[0].strip().splitlines()[-1]) for child in children]
    rss, pss = sum(r["rss"] for r in results), sum(r["pss"] for r in results)
    print(f"two bf16-mode processes on one checkpoint: combined RSS {rss / 2**30:.2f} GiB, combined PSS {pss / 2**30:.2f} GiB")


def pss_bytes() -> int:
    """Proportional set size: shared pages (the mapped checkpoint) split between the processes mapping them."""
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- PyTorch side


def torch_side(folder: Path, args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3]]))
    result = {
        "ready_s": time.perf_counter() - started, "rss_after_load": status_bytes("VmRSS"),
        "blas": f"torch {torch.__version__} ({'MKL' if torch.backends.mkl.is_available() else 'no MKL'}), "
        f"threads={torch.get_num_threads()}, attention={model.config._attn_implementation}, "
        f"ATen kernels {torch.backends.cpu.get_cpu_capability()}, "
        f"MKL_ENABLE_INSTRUCTIONS={os.environ.get('MKL_ENABLE_INSTRUCTIONS', 'unset')}",
    }
    with torch.inference_mode():
        for length in PREFILL_LENGTHS[: 1 if args.quick else 2]:
            ids = torch.tensor([prompt(length, length)])
            result[f"prefill_{length}"] = length / best_of(3, lambda: model(ids, use_cache=True, logits_to_keep=1))
        result.update(torch_prefill_products(model, torch, PREFILL_LENGTHS[: 1 if args.quick else 2]))
        torch.set_float32_matmul_precision("medium")  # PyTorch's own bf16 products for float32 weights (oneDNN)
        for length in PREFILL_LENGTHS[: 1 if args.quick else 2]:
            ids = torch.tensor([prompt(length, length)])
            result[f"prefill_bf16_{length}"] = length / best_of(
                3, lambda: model(ids, use_cache=True, logits_to_keep=1))
        torch.set_float32_matmul_precision("highest")
        result["decode_1"] = torch_decode(model, torch, 1, 16 if args.quick else 128)
        for batch in BATCHES:
            result[f"bare_{batch}"] = torch_decode(model, torch, batch, 8 if args.quick else args.batch_tokens)
    result["peak_rss"] = status_bytes("VmHWM")
    return result


def kestrel_prefill(model, args: argparse.Namespace) -> dict:
    """Prefill tok/s of each length, float32, then with ``prefill_precision="bf16"`` (AMX tiles) or why not."""
    import attrs

    from kestrel_trio._kernels import enable_tiles

    prompts = {n: prompt(n, n) for n in PREFILL_LENGTHS[: 1 if args.quick else 2]}

    def rates(key: str) -> dict:
        return {f"{key}_{n}": n / best_of(3, lambda: model.prefill(model.new_cache(), ids)) for n, ids in prompts.items()}

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
        result[f"products_gflop_{n}"] = 2 * n * sum(m.size for m in matrices) / 1e9
    return result


def chunk_product(model, rows: int):
    """``call(x, m)``: the product a prefill chunk of ``rows`` tokens makes of ``x`` [rows, in] and weight ``m``.

    Where its layers run packed (kestrel_trio._model.decoder.packed_layers): the q/k/v product packed in and
    gathered into rows, o_proj's packed by each thread from rows, gate/up's and down's packed in and out (inputs
    packed here, untimed, as a prefill keeps them packed); else ``linear``.
    """
    from kestrel_trio._kernels.x86 import packed_rows
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


def torch_prefill_products(model, torch, lengths) -> dict:
    """Seconds of PyTorch's layer products (its own, unfused linears; every layer on every row), n rows at once."""
    names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj")
    matrices = [layer.get_submodule(name).weight for layer in model.model.layers for name in names]
    result = {}
    for n in lengths:
        xs = {w.shape[1]: torch.randn(n, w.shape[1]) for w in matrices}  # [n, in]
        result[f"products_{n}_s"] = best_of(
            3, lambda: [torch.nn.functional.linear(xs[w.shape[1]], w) for w in matrices])
    return result


def torch_decode(model, torch, batch: int, steps: int) -> float:
    """Aggregate greedy decode tok/s of a batch of equal-length prompts, through the model's KV cache."""
    ids = torch.tensor([prompt(SHORT_PROMPT, i) for i in range(batch)])  # [B, T]
    out = model(ids, use_cache=True, logits_to_keep=1)
    cache, tokens = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        out = model(tokens, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache, tokens = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]
        times.append(time.perf_counter() - started)
    return batch / median(times)


# ---------------------------------------------------------------- GEMM shapes


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


# ---------------------------------------------------------------- orchestration

SIDES = {"kestrel": kestrel_side, "torch": torch_side, "gemm": gemm_side, "residency": residency_side, "share": share_side}


def run_side(side: str, folder: Path, args: argparse.Namespace, extra: list[str] = ()) -> dict:
    command = [sys.executable, __file__, "--side", side, "--folder", str(folder), "--threads", str(args.threads),
               "--batch-tokens", str(args.batch_tokens), *(["--quick"] if args.quick else []), *extra]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


ROWS = [("ready_s", "load to ready (s)", False)] + [
    (f"prefill_{n}", f"prefill {n} tok (tok/s)", True) for n in PREFILL_LENGTHS
] + [(f"prefill_bf16_{n}", f"prefill {n} tok, bf16 products (tok/s)", True) for n in PREFILL_LENGTHS] + [
    ("decode_1", "decode batch 1, bare forward (tok/s)", True), ("engine_1", "decode batch 1, engine (tok/s)", True)] + [
    (f"{way}_{b}", f"decode {b} seqs, {label} (tok/s)", True)
    for b in BATCHES for way, label in (("engine", "engine"), ("bare", "bare forward"))
] + [("rss_after_load", "RSS after load (GiB)", False), ("peak_rss", "peak RSS (GiB)", False)]


def best_figures(runs: list[dict]) -> dict:
    """Per figure, the best of several runs: highest rate, lowest time and memory."""
    if not runs:
        return {}
    best = dict(runs[0])
    for run in runs[1:]:
        for key, value in run.items():
            if isinstance(value, (int, float)):
                lower_is_better = key.endswith("_s") or "rss" in key
                best[key] = min(best[key], value) if lower_is_better else max(best[key], value)
    return best


def print_table(k: dict, t: dict) -> None:
    print(f"{'':34} {'kestrel':>10} {'PyTorch':>10} {'kestrel/PyTorch':>16}")
    for key, label, _higher_better in ROWS:
        if key not in k and key not in t:
            continue
        scale = 2**30 if "rss" in key else 1
        a, b = k.get(key), t.get(key)
        cell = lambda v: f"{v / scale:10.2f}" if v is not None else f"{'-':>10}"  # noqa: E731
        ratio = f"{a / b:16.2f}" if a is not None and b is not None else f"{'':>16}"
        print(f"{label:34} {cell(a)} {cell(b)} {ratio}")


def print_gemm(table: dict) -> None:
    print(f"\n[rows x 1024] @ [1024 x 3072], cold weights, us (25th percentile); {table.pop('blas')}; "
          f"kestrel's small-batch call: {table.pop('small_batch_call')}")
    step = table.pop("step")
    for rows, calls in table.items():
        print(f"  rows={rows:>2}: " + "  ".join(f"{name} {us:7.0f}" for name, us in calls.items()))
    print("\nall products of one decode step (28 layers + lm_head), ms, best of 5 (plain calls on BLAS's threads; "
          f"linear's small-batch call: {step.pop('small_batch_call')})")
    for rows, calls in step.items():
        print(f"  rows={rows:>2}: " + "  ".join(f"{name} {ms:7.1f}" for name, ms in calls.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (fewer tokens, one prefill length)")
    parser.add_argument("--threads", type=int, default=None, help="threads for both sides (default: numpy's BLAS threads)")
    parser.add_argument("--batch-tokens", type=int, default=64, help="new tokens per stream in the batched runs")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, alternated; the best figure of each is kept")
    parser.add_argument("--keep-openblas-env", action="store_true", help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE")
    parser.add_argument("--avx2", action="store_true",
                        help="both sides run the code an AVX2-only CPU would (OpenBLAS, numba, ATen, MKL, oneDNN)")
    parser.add_argument("--gemm", action="store_true", help="also time small-batch GEMM call shapes")
    parser.add_argument("--sides", default="kestrel,torch,residency", help="comma-separated: kestrel, torch, residency")
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--weights", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--barrier", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(SIDES[args.side](args.folder, args)))
        return
    if args.avx2:
        run_as_avx2_machine()
    run_without_openblas_overrides(args.keep_openblas_env or args.avx2)
    args.threads = args.threads or blas_threads()
    args.rounds = 1 if args.quick else args.rounds
    report_machine(args)
    folder = args.cache / "qwen3-0.6b-shapes-transformers-f32"
    build_checkpoint(folder, "float32")
    sides = args.sides.split(",")
    kestrel_runs, torch_runs = [], []
    for _ in range(args.rounds):  # alternate the sides so a burst of outside load hits both alike
        if "kestrel" in sides:
            kestrel_runs.append(run_side("kestrel", folder, args))
        if "torch" in sides:
            torch_runs.append(run_side("torch", folder, args))
    kestrel, torch = best_figures(kestrel_runs), best_figures(torch_runs)
    for batch in BATCHES if kestrel else ():  # every pair of every round
        kestrel[f"pair_ratios_{batch}"] = [r for run in kestrel_runs for r in run[f"pair_ratios_{batch}"]]
    for name, side in (("kestrel", kestrel), ("PyTorch", torch)):
        if side:
            print(f"{name} BLAS: {side.pop('blas')}")
    if kestrel or torch:
        print_table(kestrel, torch)
    if kestrel:
        args.bandwidth = max(args.bandwidth, kestrel.pop("bandwidth"))
        report_bound(kestrel["decode_1"], args)
        check_targets(kestrel, torch, args.fma_peak)
    if "residency" in sides:
        bf16_folder = args.cache / "qwen3-0.6b-shapes-transformers-bf16"
        build_checkpoint(bf16_folder, "bfloat16")
        runs = {"fp32": [], "bf16": []}
        for _ in range(args.rounds):
            for mode, found in runs.items():
                found.append(run_side("residency", bf16_folder, args, ["--weights", mode]))
        print_residency({mode: best_figures(found) for mode, found in runs.items()})
        measure_sharing(bf16_folder, args)
    if args.gemm:
        print_gemm(run_side("gemm", folder, args))


def print_residency(modes: dict) -> None:
    fp32, bf16 = modes["fp32"], modes["bf16"]
    print("\nweights residency, kestrel on the bf16 checkpoint (bare forward decode)")
    print(f"{'':28} {'fp32':>10} {'bf16':>10} {'bf16/fp32':>10}")
    for key, label, scale in (("rss_after_load", "RSS after load (GiB)", 2**30), ("pss_after_load", "PSS after load (GiB)", 2**30),
                              ("peak_rss", "peak RSS (GiB)", 2**30), ("ready_s", "load to ready (s)", 1),
                              ("decode_1", "decode batch 1 (tok/s)", 1), ("bare_8", "decode 8 seqs (tok/s)", 1)):
        print(f"{label:28} {fp32[key] / scale:10.2f} {bf16[key] / scale:10.2f} {bf16[key] / fp32[key]:10.2f}")
    for key in [f"prefill_{n}" for n in PREFILL_LENGTHS] + [f"prefill_bf16_{n}" for n in PREFILL_LENGTHS]:
        if key in fp32 and key in bf16:
            label = key.replace("prefill_bf16_", "prefill (bf16 tiles) ").replace("prefill_", "prefill ") + " tok/s"
            print(f"{label:28} {fp32[key]:10.2f} {bf16[key]:10.2f} {bf16[key] / fp32[key]:10.2f}")


def check_targets(k: dict, t: dict, peak: float | None) -> None:
    """Issue 19's ratios, each measured side by side in this run: met or NOT met.

    ``peak``: the float32 multiply-add peak (GFLOP/s, :func:`fma_peak`), to say what kestrel's prefill would take
    with its products at that rate and the rest as measured.
    """
    print(f"small-batch call (chosen once at load, for the bare forward and the engine alike): {k['small_batch_call']}")
    for b in BATCHES:
        ratios = k[f"pair_ratios_{b}"]
        print(f"engine / bare forward, {b} streams, pair by pair: " + ", ".join(f"{r:.3f}" for r in ratios)
              + f" (median {statistics.median(ratios):.3f}; best runs' ratio {k[f'engine_{b}'] / k[f'bare_{b}']:.3f})")
        splits = k.get(f"engine_split_{b}")
        if splits:  # per engine run: (step ms, its forward pass ms), from inside the run
            own = [(step - forward) / step for step, forward in splits]
            print(f"  the engine's own share of a {b}-stream step, run by run (outside the forward pass): "
                  + ", ".join(f"{(step - forward):.1f} of {step:.1f} ms" for step, forward in splits)
                  + f"; median {100 * statistics.median(own):.1f}%")
    checks = [(f"engine / bare forward, {b} streams (median of alternated pairs)",
               statistics.median(k[f"pair_ratios_{b}"]), 0.95)
              for b in (4, 8)]
    checks += [(f"{b} streams through the engine / engine batch 1", k[f"engine_{b}"] / k["engine_1"], goal)
               for b, goal in ((8, 4.0), (16, 6.0))]
    checks += [(f"prefill {n} / PyTorch", k[f"prefill_{n}"] / t[f"prefill_{n}"], 1.3) for n in PREFILL_LENGTHS
               if f"prefill_{n}" in k and f"prefill_{n}" in t]
    checks += [(f"prefill {n}, kestrel bf16 tiles / PyTorch fp32", k[f"prefill_bf16_{n}"] / t[f"prefill_{n}"], 1.3)
               for n in PREFILL_LENGTHS if f"prefill_bf16_{n}" in k and f"prefill_{n}" in t]
    checks += [(f"prefill {n}, kestrel bf16 tiles / PyTorch bf16 (medium)", k[f"prefill_bf16_{n}"]
                / t[f"prefill_bf16_{n}"], 1.3)
               for n in PREFILL_LENGTHS if f"prefill_bf16_{n}" in k and f"prefill_bf16_{n}" in t]
    if "tiles" in k:
        print(f"  bf16 tile prefill not measured: {k['tiles']}")
    for n in PREFILL_LENGTHS:
        if f"products_{n}_s" in k and f"products_{n}_s" in t and f"prefill_{n}" in t:
            ours, theirs, gflop = k[f"products_{n}_s"], t[f"products_{n}_s"], k[f"products_gflop_{n}"]
            whole = n / t[f"prefill_{n}"]  # seconds
            print(f"  prefill {n}, float32: PyTorch's whole prefill {whole * 1e3:.0f} ms, its layer products alone "
                  f"{theirs * 1e3:.0f} ms; kestrel's layer products alone {ours * 1e3:.0f} ms ({gflop / ours:.0f} "
                  f"GFLOP/s), against the {whole / 1.3 * 1e3:.0f} ms that 1.3x PyTorch leaves for a whole prefill")
            if peak and f"prefill_{n}" in k:
                rest = n / k[f"prefill_{n}"] - ours  # seconds of kestrel's prefill outside its layer products
                floor = gflop / peak + rest
                print(f"    at the FMA peak ({peak:.0f} GFLOP/s) those products would take {gflop / peak * 1e3:.0f} ms; "
                      f"with the rest of kestrel's prefill as measured ({rest * 1e3:.0f} ms), {floor * 1e3:.0f} ms: "
                      f"{whole / floor:.2f}x PyTorch")
    for label, ratio, goal in checks:
        print(f"  {label}: {ratio:.2f} (target >= {goal}): {'met' if ratio >= goal else 'NOT met'}")


def report_machine(args: argparse.Namespace) -> None:
    print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}; threads per side: {args.threads}")
    print(f"CPU vector flags: {cpu_vector_flags()}")
    print(f"OpenBLAS overrides: {openblas_overrides_note()}")
    print(f"numpy BLAS: {blas_description()}")
    emulated = " (--avx2: an AVX2-only machine's code)" if args.avx2 else ""
    print(f"compiled products: {compiled_kernels_description()}{emulated}")
    bandwidth = read_bandwidth(1.0 if not args.quick else 0.25, repeats=10)
    args.bandwidth = max(bandwidth.values())
    peak = fma_peak(args.threads)
    args.fma_peak = peak[0] if peak else None
    print(f"float32 FMA peak: {peak[0]:.0f} GFLOP/s ({peak[1]})" if peak else
          "float32 FMA peak: not measured (kestrel's products run no assembly here)")
    print("memory read bandwidth: " + ", ".join(f"{way} {bps / 1e9:.1f} GB/s" for way, bps in bandwidth.items()), flush=True)


def report_bound(decode_1: float, args: argparse.Namespace) -> None:
    """Batch-1 decode against bandwidth / weight bytes per token (best bandwidth seen, here and in the kestrel runs)."""
    per_token = weight_bytes_per_token()
    bound = args.bandwidth / per_token
    print(
        f"batch-1 bound: {args.bandwidth / 1e9:.1f} GB/s / {per_token / 2**30:.2f} GiB of fp32 weights per token "
        f"= {bound:.1f} tok/s; kestrel reaches {decode_1:.1f} tok/s = {decode_1 / bound:.0%} of it"
    )


if __name__ == "__main__":
    main()
