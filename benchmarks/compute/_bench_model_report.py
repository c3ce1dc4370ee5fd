"""bench_model.py's report: the machine, the table of both sides, the residency and GEMM tables, issue 19's
targets, and batch-1 decode against the memory bandwidth bound.

Rates are tokens per second, memory is printed in GiB, bandwidth in GB/s.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics

from _bench_common import (
    blas_description, compiled_kernels_description, cpu_vector_flags, fma_peak, openblas_overrides_note,
    read_bandwidth,
)
from _bench_model_plan import BATCHES, PREFILL_LENGTHS
from _checkpoints import QWEN3_0_6B


ROWS = [("ready_s", "load to ready (s)", False)] + [
    (f"prefill_{n}", f"prefill {n} tok (tok/s)", True) for n in PREFILL_LENGTHS
] + [(f"prefill_bf16_{n}", f"prefill {n} tok, bf16 products (tok/s)", True) for n in PREFILL_LENGTHS] + [
    ("decode_1", "decode batch 1, bare forward (tok/s)", True),
    ("engine_1", "decode batch 1, engine (tok/s)", True)] + [
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


def print_residency(modes: dict) -> None:
    fp32, bf16 = modes["fp32"], modes["bf16"]
    print("\nweights residency, kestrel on the bf16 checkpoint (bare forward decode)")
    print(f"{'':28} {'fp32':>10} {'bf16':>10} {'bf16/fp32':>10}")
    for key, label, scale in (("rss_after_load", "RSS after load (GiB)", 2**30),
                              ("pss_after_load", "PSS after load (GiB)", 2**30),
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
                print(f"    at the FMA peak ({peak:.0f} GFLOP/s) those products would take "
                      f"{gflop / peak * 1e3:.0f} ms; "
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
    print("memory read bandwidth: " + ", ".join(f"{way} {bps / 1e9:.1f} GB/s" for way, bps in bandwidth.items()),
          flush=True)


def report_bound(decode_1: float, args: argparse.Namespace) -> None:
    """Batch-1 decode against bandwidth / weight bytes per token (best bandwidth seen, here and in the kestrel runs)."""
    per_token = weight_bytes_per_token()
    bound = args.bandwidth / per_token
    print(
        f"batch-1 bound: {args.bandwidth / 1e9:.1f} GB/s / {per_token / 2**30:.2f} GiB of fp32 weights per token "
        f"= {bound:.1f} tok/s; kestrel reaches {decode_1:.1f} tok/s = {decode_1 / bound:.0%} of it"
    )


def weight_bytes_per_token() -> int:
    """fp32 bytes of weights one batch-1 decode step reads: every matrix plus lm_head (not embedding lookups)."""
    from kestrel_trio._model import config_from_dict, expected_shapes

    config = config_from_dict(QWEN3_0_6B)
    shapes = expected_shapes(config)
    total = sum(math.prod(s) for name, s in shapes.items() if len(s) == 2)
    if not config.tie_word_embeddings:
        total -= math.prod(shapes["model.embed_tokens.weight"])  # only looked up by row
    return 4 * total
