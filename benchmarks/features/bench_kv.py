"""KV cache storage and the KV budget on Qwen3-0.6B's shapes (random weights).

Usage:
    python benchmarks/features/bench_kv.py decode [--context 1000] [--steps 32] [--rounds 3] [--keep-openblas-env]
    python benchmarks/features/bench_kv.py budget [--kv-cache-mb 512] [--kv-dtype fp32,bf16]

``decode``: decode speed of one sequence (and of 4 sequences stepped
together) after a --context-token prompt, with the KV cache stored as fp32,
bf16 and fp16, the same random 0.6B-shaped weights in fp32 for all (the
prompts are prefilled once in fp32, the bf16/fp16 caches hold the same values
rounded); the dtypes alternate for --rounds rounds and each keeps its best
median step time. It
also reports how far bf16/fp16 KV moves the logits from fp32 KV over the same
(teacher-forced) tokens. The accuracy that matters, greedy tokens on trained
fixtures, is tests/model/test_kv_storage.py.

``budget``: the issue's acceptance run. A real ``kestrel-trio serve`` on a
0.6B-shaped checkpoint (written once into ~/.cache/kestrel-trio-bench/) with
``--kv-cache-mb`` (512: about 2,300 fp32 tokens) and ``--max-model-len 8192``,
4 concurrent completions of 1,000-token prompts and 200 new tokens each. It
reports every stream's token count, the most generations running at once, the
KV waits from /metrics, the server's peak RSS (VmHWM) against the fp32 weights
+ budget + 300 MiB, and that a request needing more than the budget, or a
prompt as long as --max-model-len, is refused with a 400 before any model step.

This machine may set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (for old OpenBLAS
builds); the benchmark re-executes itself without them unless
--keep-openblas-env, and prints the kernel OpenBLAS actually ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _bench_common import (  # noqa: E402
    blas_description, cpu_vector_flags, openblas_overrides_note, run_without_openblas_overrides,
)
from _checkpoints import QWEN3_0_6B  # noqa: E402

CACHE = Path.home() / ".cache" / "kestrel-trio-bench"
DTYPES = ("fp32", "bf16", "fp16")
MAX_MODEL_LEN = 8192  # the budget runs' context cap: above both budgets in tokens, so each refusal is the budget's


# ---------------------------------------------------------------- decode speed and logits


def in_memory_model():
    """Qwen3-0.6B's shapes with seeded random fp32 weights (std 0.02), built in memory: no checkpoint."""
    from kestrel_trio._model import Decoder, assemble_weights, config_from_dict, random_tensors
    from kestrel_trio.model import Model

    config = config_from_dict(QWEN3_0_6B)
    tensors = random_tensors(config, seed=0, std=0.02)
    weights = assemble_weights(config, tensors.__getitem__, set(tensors))
    model = Model(Decoder.build(config, weights), name="qwen3-0.6b-shapes")
    model.prepare_products()
    return model


def prompt(length: int, seed: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(1000, 150000, size=length).tolist()


def prefilled_caches(model, context: int, steps: int, batch: int) -> dict[str, list]:
    """``batch`` caches per KV dtype holding a ``context``-token prompt, capped as the engine caps them.

    Prefilled once in fp32; the bf16 / fp16 caches hold the same keys and values rounded (for timing
    decode, the same bytes to read). Each timed run cuts them back to the prompt.
    """
    from kestrel_trio._model import storage_dtype, to_storage

    capacity = -(-(context + steps + 1) // 64) * 64
    fp32 = [model.new_cache("fp32", max_tokens=capacity) for _ in range(batch)]
    for index, cache in enumerate(fp32):
        model.prefill(cache, prompt(context, index))
    caches = {"fp32": fp32}
    for dtype in DTYPES[1:]:
        caches[dtype] = []
        for source in fp32:
            cache = model.new_cache(dtype, max_tokens=capacity)
            cache.reserve(context)
            for store, values in ((cache.keys, source.keys), (cache.values, source.values)):
                for layer, array in enumerate(values):
                    store[layer][:, :context] = to_storage(array[:, :context], storage_dtype(dtype))
            cache.commit(context)
            caches[dtype].append(cache)
    return caches


def decode_seconds(model, caches: list, context: int, steps: int) -> float:
    """Median seconds of one decode step of ``len(caches)`` sequences after a ``context``-token prompt."""
    import numpy as np

    from kestrel_trio._model import forward

    for cache in caches:
        cache.truncate(context)
    tokens = np.array([1000 + 7 * i for i in range(len(caches))])  # [B]
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        positions = np.array([c.length for c in caches], dtype=np.int64)  # [B]
        logits = forward(model.decoder, tokens, positions, caches, [1] * len(caches))  # [B, vocab]
        tokens = logits.argmax(axis=-1)  # [B]
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def logit_drift(model, context: int, steps: int) -> dict[str, tuple[float, float]]:
    """Per stored dtype: (max |logit - fp32 KV's logit|, share of steps with the same argmax), same tokens fed."""
    import numpy as np

    ids = prompt(context, 7)
    reference, tokens = [], []
    cache = model.new_cache("fp32")
    logits = model.prefill(cache, ids)
    for _ in range(steps):
        reference.append(logits)
        tokens.append(int(np.argmax(logits)))
        logits = model.step(cache, tokens[-1:])
    drift = {}
    for dtype in DTYPES[1:]:
        cache = model.new_cache(dtype)
        logits = model.prefill(cache, ids)
        worst, same = 0.0, 0
        for expected, token in zip(reference, tokens):
            worst = max(worst, float(np.abs(logits - expected).max()))
            same += int(np.argmax(logits)) == int(np.argmax(expected))
            logits = model.step(cache, [token])
        drift[dtype] = (worst, same / steps)
    return drift


def run_decode(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    model = in_memory_model()
    print(f"built 0.6B-shaped weights in memory in {time.perf_counter() - started:.1f} s; "
          f"KV bytes a token: " + ", ".join(f"{d} {model.decoder.kv_token_bytes(d) // 1024} KiB" for d in DTYPES))
    print(f"numpy BLAS (after load): {blas_description()}", flush=True)
    started = time.perf_counter()
    caches = prefilled_caches(model, args.context, args.steps, 4)
    print(f"prefilled 4 x {args.context} tokens in {time.perf_counter() - started:.1f} s", flush=True)
    best: dict[tuple[str, int], float] = {}
    for round_ in range(args.rounds):
        for batch in (1, 4):
            for dtype in DTYPES:  # alternated, so a burst of outside load hits each alike
                seconds = decode_seconds(model, caches[dtype][:batch], args.context, args.steps)
                key = (dtype, batch)
                best[key] = min(best.get(key, float("inf")), seconds)
        print(f"round {round_ + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"\ndecode at a {args.context}-token context, median step of {args.steps}, best of {args.rounds} rounds")
    print(f"{'KV storage':12} {'batch 1 tok/s':>14} {'vs fp32':>8} {'batch 4 tok/s':>14} {'vs fp32':>8}")
    for dtype in DTYPES:
        one, four = 1 / best[(dtype, 1)], 4 / best[(dtype, 4)]
        print(f"{dtype:12} {one:14.2f} {one * best[('fp32', 1)]:8.3f} {four:14.2f} "
              f"{four * best[('fp32', 4)] / 4:8.3f}")
    drift = logit_drift(model, args.context, 16)
    print("\nlogits against fp32 KV over the same 16 decoded tokens (random weights):")
    for dtype, (worst, same) in drift.items():
        print(f"  {dtype}: max |delta logit| {worst:.2e}, same argmax in {same:.0%} of steps")


# ---------------------------------------------------------------- the KV budget, through a real server


def build_checkpoint(folder: Path) -> None:
    """0.6B-shaped fp32 random weights (std 0.02) plus the packaged Qwen3 tokenizer, unless already there."""
    if (folder / "tokenizer.json").exists():
        return
    import gzip
    from importlib import resources

    from kestrel_trio._model import write_random_checkpoint

    started = time.perf_counter()
    partial = folder.with_name(folder.name + ".partial")  # renamed when complete: a torn build is never reused
    shutil.rmtree(partial, ignore_errors=True)
    write_random_checkpoint(partial, QWEN3_0_6B, seed=0, dtype="F32", std=0.02)
    demo = resources.files("kestrel_trio") / "_demo"
    (partial / "tokenizer.json").write_bytes(gzip.decompress(demo.joinpath("tokenizer.json.gz").read_bytes()))
    for name in ("tokenizer_config.json", "generation_config.json"):
        (partial / name).write_bytes(demo.joinpath(name).read_bytes())
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    print(f"built {folder} in {time.perf_counter() - started:.1f} s", flush=True)


def fp32_weight_bytes() -> int:
    """Bytes of the 0.6B-shaped checkpoint's weights in float32 (every tensor once; the embedding is tied)."""
    import math

    from kestrel_trio._model import config_from_dict, expected_shapes

    return 4 * sum(math.prod(shape) for shape in expected_shapes(config_from_dict(QWEN3_0_6B)).values())


def status_of(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def http(url: str, body: dict | None = None, timeout: float = 3600) -> tuple[int, dict | str]:
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read().decode(), error.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def serve(folder: Path, flags: list[str]) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "kestrel_trio.cli", "--log-level", "WARNING", "serve", "--model", str(folder),
               "--port", "0", "--weights", "fp32", *flags]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        if "serving" in line and " at http" in line:
            return process, line.rsplit(" at ", 1)[1].strip().removesuffix("/v1")
        if "error" in line.lower():
            print("  server: " + line.rstrip())
    raise RuntimeError(f"the server exited with {process.wait()} before it served")


def budget_run(folder: Path, kv_dtype: str, kv_mb: int, streams: int, prompt_tokens: int, new_tokens: int) -> dict:
    import threading

    process, url = serve(folder, ["--kv-cache-mb", str(kv_mb), "--kv-dtype", kv_dtype, "--max-batch", str(streams),
                                  "--max-model-len", str(MAX_MODEL_LEN), "--prefix-cache-mb", "0"])
    stderr_lines: list[str] = []
    threading.Thread(target=lambda: stderr_lines.extend(process.stderr), daemon=True).start()
    try:
        _, health = http(url + "/health")
        weights_rss = status_of(process.pid, "VmRSS")
        results: list[dict] = [{} for _ in range(streams)]
        most_running = [0]
        done = threading.Event()

        def one(index: int) -> None:
            body = {"prompt": prompt(prompt_tokens, 1000 + index), "max_tokens": new_tokens, "temperature": 0,
                    "ignore_eos": True}
            try:
                status, answer = http(url + "/v1/completions", body)
            except OSError as exc:
                results[index] = {"status": "no answer", "tokens": repr(exc)}
                return
            results[index] = {"status": status, "tokens": answer["usage"]["completion_tokens"]
                              if status == 200 else answer}

        def watch() -> None:
            while not done.is_set():
                _, h = http(url + "/health", timeout=10)
                most_running[0] = max(most_running[0], h.get("active", 0))
                time.sleep(0.05)

        started = time.perf_counter()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        workers = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        done.set()
        watcher.join()
        elapsed = time.perf_counter() - started
        _, metrics = http(url + "/metrics")
        steps_before = metric(metrics, "kestrel:model_steps_total")
        over_budget = health["kv_cache"]["budget_tokens"]  # prompt + this can never fit, whatever the dtype
        too_big = http(url + "/v1/completions", {"prompt": prompt(prompt_tokens, 1), "max_tokens": over_budget})
        too_long = http(url + "/v1/completions", {"prompt": prompt(MAX_MODEL_LEN, 2), "max_tokens": 200})
        _, metrics_after = http(url + "/metrics")
        return {
            "health_kv": health.get("kv_cache"), "results": results, "most_running": most_running[0],
            "seconds": elapsed, "kv_waits": metric(metrics, "kestrel:kv_cache_waits_total"),
            "queue_time_sum": metric(metrics, "kestrel:request_queue_time_seconds_sum"),
            "rss_after_load": weights_rss, "peak_rss": status_of(process.pid, "VmHWM"),
            "too_big": too_big, "too_long": too_long, "over_budget": over_budget,
            "steps_for_refusals": metric(metrics_after, "kestrel:model_steps_total") - steps_before,
        }
    finally:
        process.terminate()
        process.wait(timeout=60)


def run_budget(args: argparse.Namespace) -> None:
    folder = args.cache / "qwen3-0.6b-shapes-f32-tokenizer"
    build_checkpoint(folder)
    for dtype in args.kv_dtype.split(","):
        print(f"\n--kv-cache-mb {args.kv_cache_mb} --kv-dtype {dtype}: {args.streams} concurrent completions of "
              f"{args.prompt_tokens} prompt tokens + {args.new_tokens} new tokens (load average "
              f"{os.getloadavg()[0]:.2f})", flush=True)
        r = budget_run(folder, dtype, args.kv_cache_mb, args.streams, args.prompt_tokens, args.new_tokens)
        kv = r["health_kv"] or {}
        print(f"  /health kv_cache at start: {json.dumps(kv)}")
        print(f"  streams: " + ", ".join(f"{x['status']} with {x['tokens']} tokens" for x in r["results"]))
        print(f"  most generations running at once: {r['most_running']}; waits for KV (kestrel:kv_cache_waits_total):"
              f" {r['kv_waits']:.0f}; queue time summed {r['queue_time_sum']:.1f} s; all done in {r['seconds']:.1f} s")
        budget = args.kv_cache_mb * 2**20
        weights = fp32_weight_bytes()
        bound = weights + budget + 300 * 2**20
        print(f"  fp32 weights {weights / 2**20:.0f} MiB; RSS after load {r['rss_after_load'] / 2**20:.0f} MiB; "
              f"peak RSS (VmHWM) {r['peak_rss'] / 2**20:.0f} MiB; bound weights + {args.kv_cache_mb} + 300 MiB = "
              f"{bound / 2**20:.0f} MiB: {'within' if r['peak_rss'] <= bound else 'OVER'} "
              f"(peak - weights = {(r['peak_rss'] - weights) / 2**20:.0f} MiB)")
        for label, (status, body) in ((f"max_tokens {r['over_budget']} (over the budget)", r["too_big"]),
                                      (f"a {MAX_MODEL_LEN}-token prompt (over --max-model-len {MAX_MODEL_LEN})",
                                       r["too_long"])):
            message = body["error"]["message"] if isinstance(body, dict) and "error" in body else body
            print(f"  {label}: {status}: {message}")
        print(f"  model steps run for those two refusals: {r['steps_for_refusals']:.0f}")
        print(f"  (load average at the end {os.getloadavg()[0]:.2f})", flush=True)


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["decode", "budget"])
    parser.add_argument("--context", type=int, default=1000, help="prompt tokens before the decode steps")
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed per run")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each KV dtype, alternated; the best is kept")
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--kv-dtype", default="fp32,bf16", help="comma-separated KV dtypes for the budget runs")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--keep-openblas-env", action="store_true", help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE")
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args()
    run_without_openblas_overrides(args.keep_openblas_env)
    print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}")
    print(f"CPU vector flags: {cpu_vector_flags()}")
    print(f"OpenBLAS overrides: {openblas_overrides_note()}")
    print(f"numpy BLAS: {blas_description()}", flush=True)
    if args.what == "decode":
        run_decode(args)
    else:
        run_budget(args)


if __name__ == "__main__":
    main()
