"""Load time and peak RSS of a checkpoint with Qwen3-0.6B's exact shapes (random weights).

Usage:
    python benchmarks/weights/bench_load.py [--dtype BF16|F32|both] [--cache DIR]

Builds the checkpoint once (seeded random weights, tied embeddings) in a cache
folder outside the repository, then loads it in a fresh subprocess per run and
reports the time until the model is ready and the subprocess's peak RSS, next
to the size of the weights in float32. Targets: < 5 s to ready, peak RSS <=
1.3x the fp32 weight size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _checkpoints import build  # noqa: E402

def measure(folder: Path) -> dict:
    """Load in a fresh interpreter; its time to ready and peak RSS."""
    child = (
        "import json, sys, time\n"
        "start = time.perf_counter()\n"
        "from kestrel_trio import load_model\n"
        "model = load_model(sys.argv[1])\n"
        "model.logits([1, 2, 3])\n"
        "ready = time.perf_counter() - start\n"
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork + exec.
        "peak = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "print(json.dumps({'ready_s': ready, 'peak_rss_bytes': peak}))\n"
    )
    out = subprocess.run([sys.executable, "-c", child, str(folder)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["BF16", "F32", "both"], default="both")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "kestrel-trio-bench")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    dtypes = ["BF16", "F32"] if args.dtype == "both" else [args.dtype]
    print(f"machine: {os.cpu_count()} cpus; load average {os.getloadavg()[0]:.2f}")
    for dtype in dtypes:
        folder = args.cache / f"qwen3-0.6b-shapes-{dtype.lower()}"
        params = build(folder, dtype)
        fp32_bytes = params * 4
        runs = [measure(folder) for _ in range(args.runs)]
        best = min(r["ready_s"] for r in runs)
        times = ", ".join(f"{r['ready_s']:.2f}" for r in runs)
        peak = max(r["peak_rss_bytes"] for r in runs)
        print(
            f"{dtype:>5} storage: {params / 1e6:.1f} M params, fp32 weights {fp32_bytes / 2**30:.2f} GiB | "
            f"ready {best:.2f} s (runs: {times}; target < 5 s) | "
            f"peak RSS {peak / 2**30:.2f} GiB = {peak / fp32_bytes:.2f}x fp32 weights (target <= 1.3x)"
        )


if __name__ == "__main__":
    main()
