"""Quantized residency on Qwen3-0.6B's shapes: memory, decode speed and load time of every form, side by side.

Usage:
    python benchmarks/weights/bench_quant.py [--rounds N] [--forms fp32,bf16,int8,int4,Q8_0,Q4_K]
                                             [--kernels native,Haswell] [--steps N] [--threads N] [--cache DIR]
                                             [--no-moe]

Builds once, in ~/.cache/kestrel-trio-bench/ (outside the repository):

* the bf16 checkpoint of bench_load.py (Qwen3-0.6B's exact shapes, seeded
  random weights, tied embeddings), loaded as fp32, bf16, int8 and int4;
* GGUF files of the same shapes, written with the ``gguf`` package's
  GGUFWriter: Q8_0 (those weights, quantized by ``gguf.quants.quantize``) and
  Q4_K (random valid blocks with weight-sized scales: ``gguf`` cannot make
  K-quants), loaded with ``weights="gguf"``;
* a reduced Qwen3-MoE GGUF (32 experts, 4 routed per token, Q4_K experts).

Each form runs in its own fresh subprocess (so RSS is its own) and reports:
RSS after load (model ready, one forward done) and after a first completion
(8 prompt tokens, 16 new), load-to-ready time, and bare-forward decode at
batch 1 and with 8 sequences stepped together (median step time, so bursts of
outside load do not decide it), also per second of the process's CPU time
(with ``--threads 1``, the step's cost when the core is not shared: on a busy
machine the fairer comparison). The forms alternate for ``--rounds`` rounds
and each figure keeps its best; ratios are to fp32 measured in the same round
set. int8/int4 quantize at their first load and write the on-disk cache
(measured once, as "first load"); later loads map it.

For the MoE file it counts, per decode step, the expert bytes the products
expand: only the routed experts' (4 of 32 per layer) are.

OpenBLAS: this machine may set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for old
builds. Every side runs without them ("native": the kernel OpenBLAS picks for
this CPU) and, with ``--kernels native,Haswell``, once more with
OPENBLAS_CORETYPE=Haswell; each side prints the kernel that actually ran. The
load average is printed with every figure: on a shared machine the absolute
figures drift, ratios measured side by side in one run much less.
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
    NUMBA_CPU_FOR_KERNEL, OPENBLAS_OVERRIDES, blas_description, compiled_kernels_description, cpu_vector_flags,
    load_average, status_bytes,
)
from _checkpoints import (  # noqa: E402
    QWEN3_0_6B, build, build_dense_gguf, qwen3_writer, random_k_blocks, write_gguf,
)

CACHE = Path.home() / ".cache" / "kestrel-trio-bench"
FORMS = ("fp32", "bf16", "int8", "int4", "Q8_0", "Q4_K")
GGUF_FORMS = ("Q8_0", "Q4_K")
# Targets of issue 17 (ratios to fp32 residency), checked in the summary.
MEMORY_TARGETS = {"Q8_0": 0.30, "Q4_K": 0.18}
SPEED_TARGETS = {"int8": 1.0, "Q8_0": 0.8, "Q4_K": 0.5}
LOAD_TARGET_S = {"Q8_0": 2.0}
MOE = {
    "hidden": 1024, "layers": 4, "heads": 16, "kv_heads": 4, "head_dim": 64, "experts": 32, "top_k": 4,
    "moe_inter": 512, "vocab": 8192,
}


# ---------------------------------------------------------------- building the files


def build_moe_gguf(path: Path) -> None:
    """A reduced Qwen3-MoE: MOE's shapes, Q4_K experts, Q8_0 attention, an F32 router, tied embeddings."""
    if path.exists():
        return
    import gguf
    import numpy as np

    m = MOE
    rng = np.random.default_rng(23)
    writer = qwen3_writer("qwen3moe", "qwen3moe-reduced", layers=m["layers"], context=4096, hidden=m["hidden"],
                          inter=m["moe_inter"], heads=m["heads"], kv_heads=m["kv_heads"], head_dim=m["head_dim"],
                          vocab=m["vocab"])
    writer.add_expert_count(m["experts"])
    writer.add_expert_used_count(m["top_k"])
    writer.add_expert_feed_forward_length(m["moe_inter"])
    q8 = gguf.GGMLQuantizationType.Q8_0

    def matrix(rows: int, cols: int):
        return gguf.quants.quantize((rng.standard_normal((rows, cols)) * 0.02).astype(np.float32), q8)

    h, hd, e, inter = m["hidden"], m["head_dim"], m["experts"], m["moe_inter"]
    writer.add_tensor("token_embd.weight", matrix(m["vocab"], h), raw_dtype=q8)
    writer.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    for i in range(m["layers"]):
        b = f"blk.{i}."
        for name, size in (("attn_norm", h), ("ffn_norm", h), ("attn_q_norm", hd), ("attn_k_norm", hd)):
            writer.add_tensor(f"{b}{name}.weight", np.ones(size, dtype=np.float32))
        writer.add_tensor(b + "attn_q.weight", matrix(m["heads"] * hd, h), raw_dtype=q8)
        writer.add_tensor(b + "attn_k.weight", matrix(m["kv_heads"] * hd, h), raw_dtype=q8)
        writer.add_tensor(b + "attn_v.weight", matrix(m["kv_heads"] * hd, h), raw_dtype=q8)
        writer.add_tensor(b + "attn_output.weight", matrix(h, m["heads"] * hd), raw_dtype=q8)
        writer.add_tensor(b + "ffn_gate_inp.weight", (rng.standard_normal((e, h)) * 0.02).astype(np.float32))
        k4 = gguf.GGMLQuantizationType.Q4_K
        writer.add_tensor(b + "ffn_gate_exps.weight", random_k_blocks(rng, "Q4_K", inter, h, e), raw_dtype=k4)
        writer.add_tensor(b + "ffn_up_exps.weight", random_k_blocks(rng, "Q4_K", inter, h, e), raw_dtype=k4)
        writer.add_tensor(b + "ffn_down_exps.weight", random_k_blocks(rng, "Q4_K", h, inter, e), raw_dtype=k4)
    write_gguf(writer, path)
    print(f"built {path} ({path.stat().st_size / 2**20:.0f} MiB)", flush=True)


# ---------------------------------------------------------------- measured in a subprocess


def prompt(length: int, seed: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(1000, 150000, size=length).tolist()


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def bare_decode(model, batch: int, steps: int, vocab: int) -> tuple[float, float]:
    """Aggregate greedy decode of ``batch`` sequences stepped together through forward() (median step).

    Returns tokens per second of wall time, and tokens per second of this
    process's CPU time (all its threads): with one thread, what the step
    would take if nothing else wanted the core, which on a busy machine the
    wall time does not show.
    """
    import numpy as np

    from kestrel_trio._model import forward

    caches = [model.new_cache() for _ in range(batch)]
    tokens = np.array([int(np.argmax(model.prefill(c, [t % vocab for t in prompt(8, i)]))) for i, c in enumerate(caches)])
    times, cpu = [], []
    for _ in range(steps):
        started, started_cpu = time.perf_counter(), time.process_time()
        positions = np.array([c.length for c in caches], dtype=np.int64)  # [B]
        tokens = forward(model.decoder, tokens, positions, caches, [1] * batch).argmax(axis=-1)  # [B]
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return batch / median(times), batch / median(cpu)


def form_side(args: argparse.Namespace) -> dict:
    """One form: load, RSS, a first completion, decode at batch 1 and 8."""
    started = time.perf_counter()
    from kestrel_trio import load_model
    from kestrel_trio._model import small_batch_call

    load_before = os.getloadavg()[0]
    model = load_model(args.model, weights=args.weights, blas_threads=args.threads, quantized_cache=args.qcache)
    model.logits([1, 2, 3])
    result = {"ready_s": time.perf_counter() - started, "rss_after_load": status_bytes("VmRSS"),
              "mode": model.weights_mode, "blas": blas_description(), "compiled": compiled_kernels_description()}
    model.greedy(prompt(8, 1), 16)
    result["rss_after_completion"] = status_bytes("VmRSS")
    result["decode_1"], result["decode_cpu_1"] = bare_decode(model, 1, args.steps, QWEN3_0_6B["vocab_size"])
    result["decode_8"], result["decode_cpu_8"] = bare_decode(model, 8, max(4, args.steps // 2),
                                                             QWEN3_0_6B["vocab_size"])
    result["peak_rss"] = status_bytes("VmHWM")
    result["small_batch_call"] = small_batch_call()
    result["load_avg"] = [load_before, os.getloadavg()[0]]
    return result


def moe_side(args: argparse.Namespace) -> dict:
    """The reduced MoE GGUF in gguf mode: expert bytes expanded per decode step, against all experts' bytes."""
    import numpy as np

    from kestrel_trio import _kernels, load_model
    from kestrel_trio._model import GgmlRows

    model = load_model(args.model, weights="gguf", blas_threads=args.threads)
    rss_load = status_bytes("VmRSS")
    experts = [e for layer in model.decoder.weights.layers for e in layer.mlp.experts]
    owner = {}
    for index, expert in enumerate(experts):
        for matrix in (expert.gate_up_proj, expert.down_proj):
            for part in matrix.parts:
                owner[part.data.__array_interface__["data"][0]] = (index, part.data.nbytes)
    total = sum(size for _, size in owner.values())
    touched: list[tuple[int, int]] = []
    original, compiled, expanded = GgmlRows.integer, _kernels.packed_product, _kernels.packed_expand

    def record(data, start: int, stop: int) -> None:
        found = owner.get(data.__array_interface__["data"][0])
        if found is not None:
            touched.append((found[0], (stop - start) * data.shape[1]))

    def integer(part, start, stop, out):  # numpy's expansion (prefill, or where numba is missing)
        record(part.data, start, stop)
        return original(part, start, stop, out)

    def packed_product(form, data, scales, x, start, stop, out):  # compiled products (decode steps)
        record(data, start, stop)
        return compiled(form, data, scales, x, start, stop, out)

    def packed_expand(form, data, scales, start, stop, out):  # compiled expansions (prefill chunks)
        record(data, start, stop)
        return expanded(form, data, scales, start, stop, out)

    GgmlRows.integer, _kernels.packed_product, _kernels.packed_expand = integer, packed_product, packed_expand
    cache = model.new_cache()
    model.prefill(cache, [t % MOE["vocab"] for t in prompt(6, 3)])
    per_step, routed = [], []
    token = 7
    for _ in range(args.steps):
        touched.clear()
        logits = model.step(cache, [token])
        token = int(np.argmax(logits))
        per_step.append(sum(size for _, size in touched))
        routed.append(len({e for e, _ in touched}))
    GgmlRows.integer, _kernels.packed_product, _kernels.packed_expand = original, compiled, expanded
    return {"expert_bytes": total, "expanded_per_step": per_step, "experts_per_step": routed,
            "layers": MOE["layers"], "experts": MOE["experts"], "top_k": MOE["top_k"],
            "rss_after_load": rss_load, "rss_after_steps": status_bytes("VmRSS"),
            "file_bytes": Path(args.model).stat().st_size, "load_avg": os.getloadavg()[0]}


SIDES = {"form": form_side, "moe": moe_side}


# ---------------------------------------------------------------- orchestration


def kernel_env(kernel: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_OVERRIDES and k != "NUMBA_CPU_NAME"}
    if kernel != "native":
        env["OPENBLAS_CORETYPE"] = kernel
        if kernel in NUMBA_CPU_FOR_KERNEL:
            env["NUMBA_CPU_NAME"] = NUMBA_CPU_FOR_KERNEL[kernel]
    return env


def run_side(side: str, kernel: str, args: argparse.Namespace, extra: list[str]) -> dict:
    command = [sys.executable, __file__, "--side", side, "--steps", str(args.steps),
               *(["--threads", str(args.threads)] if args.threads else []), *extra]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=kernel_env(kernel))
    return json.loads(out.stdout.strip().splitlines()[-1])


def form_args(form: str, args: argparse.Namespace) -> list[str]:
    if form in GGUF_FORMS:
        return ["--model", str(args.cache / f"qwen3-0.6b-shapes-{form.lower()}.gguf"), "--weights", "gguf"]
    return ["--model", str(args.cache / "qwen3-0.6b-shapes-bf16"), "--weights", form,
            "--qcache", str(args.cache / "quantized")]


def keep_best(best: dict, run: dict) -> None:
    for key, value in run.items():
        if key not in best or not isinstance(value, (int, float)):
            best.setdefault(key, value)
        elif key.startswith("decode"):
            best[key] = max(best[key], value)
        else:
            best[key] = min(best[key], value)
    best.setdefault("load_avgs", []).extend(run["load_avg"])


def measure_kernel(kernel: str, args: argparse.Namespace) -> dict:
    results: dict[str, dict] = {form: {} for form in args.forms}
    for form in ("int8", "int4"):  # the first load quantizes and writes the cache: measured once
        if form in args.forms:
            first = run_side("form", kernel, args, form_args(form, args))
            results[form]["first_load_s"] = first["ready_s"]
    for _ in range(args.rounds):
        for form in args.forms:
            run = run_side("form", kernel, args, form_args(form, args))
            keep_best(results[form], run)
            print(f"  [{kernel}] {form:5} ready {run['ready_s']:.2f} s, decode 1: {run['decode_1']:.2f} tok/s, "
                  f"8: {run['decode_8']:.2f} tok/s (load average {run['load_avg'][0]:.2f}-{run['load_avg'][1]:.2f})",
                  flush=True)
    return results


def print_table(kernel: str, results: dict) -> None:
    forms = [f for f in FORMS if f in results]
    base = results.get("fp32", {})
    blas = next(iter(results.values())).get("blas", "?")
    first = next(iter(results.values()))
    print(f"\nkernel {kernel}: {blas}; small-batch call {first.get('small_batch_call')}")
    print(f"fused products: {first.get('compiled', '?')}")
    print("(per CPU-second: tokens per second of the process's CPU time, all threads; with --threads 1 what a "
          "step costs when the core is not shared)")
    print(f"{'':30}" + "".join(f"{f:>10}" for f in forms))

    def row(label: str, key: str, scale: float = 1.0, fmt: str = "{:10.2f}", ratio: bool = False) -> None:
        cells = []
        for f in forms:
            value = results[f].get(key)
            if value is None:
                cells.append(f"{'-':>10}")
            elif ratio:
                cells.append(f"{value / base[key]:10.2f}" if base.get(key) else f"{'-':>10}")
            else:
                cells.append(fmt.format(value / scale))
        print(f"{label:30}" + "".join(cells))

    row("RSS after load (GiB)", "rss_after_load", 2**30)
    row("  / fp32", "rss_after_load", ratio=True)
    row("RSS after a completion (GiB)", "rss_after_completion", 2**30)
    row("  / fp32", "rss_after_completion", ratio=True)
    row("peak RSS (GiB)", "peak_rss", 2**30)
    row("load to ready (s)", "ready_s")
    row("first load, quantizing (s)", "first_load_s")
    row("decode batch 1 (tok/s)", "decode_1")
    row("  / fp32", "decode_1", ratio=True)
    row("decode 8 sequences (tok/s)", "decode_8")
    row("  / fp32", "decode_8", ratio=True)
    row("batch 1, per CPU-second", "decode_cpu_1")
    row("  / fp32", "decode_cpu_1", ratio=True)
    row("8 sequences, per CPU-second", "decode_cpu_8")
    row("  / fp32", "decode_cpu_8", ratio=True)
    spans = {f: (min(r["load_avgs"]), max(r["load_avgs"])) for f, r in results.items() if r.get("load_avgs")}
    print(f"{'load average (min-max)':30}" + "".join(f"{spans[f][0]:5.1f}-{spans[f][1]:<4.1f}" for f in forms))
    check_targets(results)


def check_targets(results: dict) -> None:
    base = results.get("fp32")
    if not base:
        return
    lines = []
    for form, target in MEMORY_TARGETS.items():
        if form in results:
            for key in ("rss_after_load", "rss_after_completion"):
                got = results[form][key] / base[key]
                lines.append(f"{form} {key.replace('_', ' ')} {got:.3f}x fp32 (target <= {target}): "
                             f"{'met' if got <= target else 'NOT met'}")
    for form, target in SPEED_TARGETS.items():
        if form in results:
            got = results[form]["decode_1"] / base["decode_1"]
            lines.append(f"{form} decode batch 1 {got:.2f}x fp32 (target >= {target}): {'met' if got >= target else 'NOT met'}")
    quantized = [f for f in ("int8", "int4", "Q8_0", "Q4_K") if f in results]
    if quantized:
        best = max(quantized, key=lambda f: results[f]["decode_8"])
        got = results[best]["decode_8"] / base["decode_8"]
        lines.append(f"8 sequences, best quantized form ({best}) {got:.2f}x fp32 (target >= 1.0): "
                     f"{'met' if got >= 1.0 else 'NOT met'}")
    for form, target in LOAD_TARGET_S.items():
        if form in results:
            got = results[form]["ready_s"]
            lines.append(f"{form} GGUF ready in {got:.2f} s (target <= {target} s): {'met' if got <= target else 'NOT met'}")
    print("targets: " + "\n         ".join(lines))


def print_moe(result: dict) -> None:
    per_step = result["expanded_per_step"]
    share = [b / result["expert_bytes"] for b in per_step]
    print(f"\nreduced Qwen3-MoE GGUF ({result['layers']} layers, {result['experts']} Q4_K experts, "
          f"{result['top_k']} routed per token; file {result['file_bytes'] / 2**20:.0f} MiB), weights=gguf, "
          f"load average {result['load_avg']:.2f}:")
    print(f"  expert bytes expanded per decode step: {min(per_step) / 2**20:.2f}-{max(per_step) / 2**20:.2f} MiB of "
          f"{result['expert_bytes'] / 2**20:.0f} MiB = {min(share):.3f}-{max(share):.3f} "
          f"(routed share top_k / experts = {result['top_k'] / result['experts']:.3f})")
    print(f"  experts expanded per step: {sorted(set(result['experts_per_step']))} "
          f"(at most {result['top_k']} per layer x {result['layers']} layers = {result['top_k'] * result['layers']})")
    print(f"  RSS after load {result['rss_after_load'] / 2**20:.0f} MiB, after {len(per_step)} decode steps "
          f"{result['rss_after_steps'] / 2**20:.0f} MiB (mapped pages count once touched)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="runs of each form, alternated; best figure kept")
    parser.add_argument("--forms", default=",".join(FORMS), help="comma-separated, of " + ", ".join(FORMS))
    parser.add_argument("--kernels", default="native,Haswell",
                        help="OpenBLAS kernels: native (none forced) and/or OPENBLAS_CORETYPE values")
    parser.add_argument("--steps", type=int, default=24, help="decode steps timed at batch 1 (half at batch 8)")
    parser.add_argument("--threads", type=int, default=None,
                        help="blas_threads (default: numpy's BLAS threads); 1 makes the per-CPU-second rates "
                             "comparable on a busy machine")
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--no-moe", action="store_true", help="skip the MoE part")
    parser.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    parser.add_argument("--qcache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(SIDES[args.side](args)))
        return
    args.forms = [f for f in args.forms.split(",") if f]
    unknown = set(args.forms) - set(FORMS)
    if unknown:
        parser.error(f"unknown forms {sorted(unknown)}")
    print(f"machine: {cpu_vector_flags()}; load average {load_average()}")
    overridden = [f"{n}={os.environ[n]}" for n in OPENBLAS_OVERRIDES if n in os.environ]
    print(f"OpenBLAS overrides in the environment: {', '.join(overridden) or 'none'}; every side runs without them "
          f"(kernels asked: {args.kernels})")
    print(f"numpy BLAS here: {blas_description()}", flush=True)
    folder = args.cache / "qwen3-0.6b-shapes-bf16"
    params = build(folder, "BF16")
    print(f"checkpoint: {folder} ({params / 1e6:.0f} M parameters, fp32 weights {params * 4 / 2**30:.2f} GiB)")
    for form in GGUF_FORMS:
        if form in args.forms:
            build_dense_gguf(args.cache / f"qwen3-0.6b-shapes-{form.lower()}.gguf", form, folder)
    shutil.rmtree(args.cache / "quantized", ignore_errors=True)  # int8/int4: the first load quantizes
    for kernel in args.kernels.split(","):
        print(f"\n== kernel {kernel} ==", flush=True)
        print_table(kernel, measure_kernel(kernel, args))
    if not args.no_moe:
        moe_path = args.cache / "qwen3moe-reduced-q4_k.gguf"
        build_moe_gguf(moe_path)
        print_moe(run_side("moe", args.kernels.split(",")[0], args, ["--model", str(moe_path)]))
    print(f"\nload average at the end: {load_average()} (a shared machine: figures are from a busy machine "
          "unless this stayed near 0)")


if __name__ == "__main__":
    main()
