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
also measures the machine's memory read bandwidth with numpy and reports
kestrel's batch-1 decode as a fraction of bandwidth / bytes of weights read
per token, and (bf16 checkpoint) kestrel's two weight residencies side by side.

This machine may set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (for old OpenBLAS
builds); the benchmark re-executes itself without them unless
--keep-openblas-env, and prints the kernel OpenBLAS actually ran. ``--avx2``
makes a CPU with AVX-512 run, on both sides, the code an AVX2-only CPU would
(OpenBLAS's Haswell kernels, numba's haswell target, PyTorch's AVX2 ATen,
MKL and oneDNN): the header and the PyTorch BLAS line print what ran.

This file starts the sides and prints what they return: the kestrel sides are
in _bench_model_kestrel.py, the PyTorch side and the checkpoint in _bench_model_torch.py,
the tables and targets in _bench_model_report.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _bench_common import blas_threads, run_as_avx2_machine, run_without_openblas_overrides  # noqa: E402
from _bench_model_kestrel import gemm_side, kestrel_side, residency_side, share_side  # noqa: E402
from _bench_model_plan import BATCHES  # noqa: E402
from _bench_model_report import (  # noqa: E402
    best_figures, check_targets, print_gemm, print_residency, print_table, report_bound, report_machine,
)
from _bench_model_torch import build_checkpoint, torch_side  # noqa: E402

CACHE = Path.home() / ".cache" / "kestrel-trio-bench"
# Each side runs in its own fresh subprocess (this script again, with --side), so peak RSS is its own.
SIDES = {"kestrel": kestrel_side, "torch": torch_side, "gemm": gemm_side, "residency": residency_side,
         "share": share_side}


def run_side(side: str, folder: Path, args: argparse.Namespace, extra: list[str] = ()) -> dict:
    command = [sys.executable, __file__, "--side", side, "--folder", str(folder), "--threads", str(args.threads),
               "--batch-tokens", str(args.batch_tokens), *(["--quick"] if args.quick else []), *extra]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_sharing(folder: Path, args: argparse.Namespace) -> None:
    """Two bf16-mode processes on one checkpoint at once: their RSS and PSS (the mapped weights count once in PSS)."""
    import tempfile

    with tempfile.TemporaryDirectory() as barrier:
        command = [sys.executable, __file__, "--side", "share", "--folder", str(folder), "--barrier", barrier]
        children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
        results = [json.loads(child.communicate(timeout=300)[0].strip().splitlines()[-1]) for child in children]
    rss, pss = sum(r["rss"] for r in results), sum(r["pss"] for r in results)
    print(f"two bf16-mode processes on one checkpoint: combined RSS {rss / 2**30:.2f} GiB, "
          f"combined PSS {pss / 2**30:.2f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (fewer tokens, one prefill length)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for both sides (default: numpy's BLAS threads)")
    parser.add_argument("--batch-tokens", type=int, default=64, help="new tokens per stream in the batched runs")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each side, alternated; the best figure of each is kept")
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


if __name__ == "__main__":
    main()
