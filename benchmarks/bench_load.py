"""Load time and peak RSS of a checkpoint with Qwen3-0.6B's exact shapes (random weights).

Usage:
    python benchmarks/bench_load.py [--dtype BF16|F32|both] [--cache DIR]

Builds the checkpoint once (seeded random weights, tied embeddings) in a cache
folder outside the repository, then loads it in a fresh subprocess per run and
reports the time until the model is ready and the subprocess's peak RSS, next
to the size of the weights in float32. Targets: < 5 s to ready, peak RSS <=
1.3x the fp32 weight size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 1000000,
    "rope_scaling": None, "torch_dtype": "bfloat16", "attention_bias": False, "hidden_act": "silu",
}


def build(folder: Path, dtype: str) -> int:
    """Write the checkpoint unless it is there; return its parameter count."""
    from kestrel_trio._model import config_from_dict, expected_shapes, write_random_checkpoint

    shapes = expected_shapes(config_from_dict(QWEN3_0_6B))
    params = sum(math.prod(shape) for shape in shapes.values())
    if not (folder / "config.json").exists():
        started = time.perf_counter()
        # Build beside the target and rename when complete, so an interrupted build is never reused.
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        write_random_checkpoint(partial, QWEN3_0_6B, seed=0, dtype=dtype, std=0.02)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
        print(f"built {folder} in {time.perf_counter() - started:.1f} s", flush=True)
    return params


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
