"""Integer products against the exact ones, side by side in one run, on Qwen3-0.6B's decode-step matrices.

Usage:
    python benchmarks/compute/bench_integer.py [--forms Q8_0,Q4_0,Q4_K,Q6_K] [--rows 1,8] [--threads 1,2] [--repeats N]
                                       [--avx2]

For each form, activation row count and thread count it times one decode
layer's products (q/k/v fused [4096, 1024], o [1024, 2048], gate/up fused
[6144, 1024], down [1024, 3072]; random valid blocks, the whole layer about
the size of the file's) through ``_kernels.packed_product``, once in the exact
mode (every weight expanded to float32) and once in the integer mode
(activations quantized once per matrix, as the model's fused products do,
the quantization timed with it), the modes alternating for ``--repeats``
rounds, each keeping its shortest layer (wall clock, and separately the
process's CPU time: on a shared machine the fairer cost). Threads share each matrix's rows in contiguous
stretches, as the model's product threads do. It prints the CPU's vector
flags, the CPU numba compiled for, the kernel each product took and the
ratio exact / integer (above 1: the integer product is faster).

``--avx2`` re-runs itself as an AVX2-only machine: numba compiles for
``haswell`` with that CPU's features only (``NUMBA_CPU_FEATURES`` empty:
numba given a CPU name alone keeps the host's features), so the integer
products take the AVX2 kernel.

Weights are 4 layers' worth (a fresh one each repeat, cycling), ~50-110 MB,
so that they come from memory rather than cache, as in a decode step.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _bench_common import cpu_vector_flags, load_average  # noqa: E402

# Qwen3-0.6B: hidden 1024, 16 q heads and 8 kv heads of 128, intermediate 3072. (name, out rows, in cols)
MATRICES = (("qkv", 4096, 1024), ("o", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072))
BLOCK = {"Q8_0": (34, 32), "Q4_0": (18, 32), "Q4_1": (20, 32), "Q4_K": (144, 256), "Q5_0": (22, 32),
         "Q5_1": (24, 32), "Q5_K": (176, 256), "Q6_K": (210, 256)}  # bytes, weights a block
# Where each form's float16 scales are: d, then m (Q4_1, Q5_1) or dmin (Q4_K, Q5_K); Q6_K's d is its last two bytes.
HALVES = {"Q6_K": (208,), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2)}
LAYERS = 4  # distinct copies cycled through, so that the weights stream from memory


def random_blocks(form: str, rng, rows: int, cols: int) -> np.ndarray:
    """uint8 [rows, row bytes]: random quants, float16 scales of weight size (finite), as a GGUF stores them."""
    size, per = BLOCK[form]
    raw = rng.integers(0, 256, (rows, cols // per, size), dtype=np.uint8)  # [rows, blocks, bytes]
    for at in HALVES.get(form, (0,)):
        raw[:, :, at : at + 2] = (rng.uniform(0.5, 1.5, (rows, cols // per, 1)) * 1e-3).astype(np.float16).view(
            np.uint8)
    return raw.reshape(rows, -1)


class Pool:
    """``count`` threads each running its share of a task list, started once (as the model's product threads)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.tasks: list = []
        self.start_barrier = threading.Barrier(count + 1)
        self.done_barrier = threading.Barrier(count + 1)
        self.threads = [threading.Thread(target=self._serve, args=(i,), daemon=True) for i in range(count)]
        for t in self.threads:
            t.start()

    def _serve(self, i: int) -> None:
        while True:
            self.start_barrier.wait()
            if self.tasks is None:
                return
            self.tasks[i]()
            self.done_barrier.wait()

    def run(self, tasks) -> None:
        self.tasks = tasks
        self.start_barrier.wait(timeout=60)
        self.done_barrier.wait(timeout=60)

    def stop(self) -> None:
        self.tasks = None
        self.start_barrier.wait(timeout=60)


def layer_step(kernels, form: str, layer: list[np.ndarray], x_of: dict, outs: dict, pool: Pool | None,
               mode: str) -> None:
    """One layer's four products of ``x_of[cols]`` [N, cols] in products ``mode`` (quantized once per matrix in the
    integer mode)."""
    for data, (name, rows, cols) in zip(layer, MATRICES):
        x, out = x_of[cols], outs[name]
        quantized = kernels.quantize_activations(x, [form], mode)
        if pool is None:
            kernels.packed_product(form, data, None, x, 0, rows, out, quantized, mode=mode)
        else:
            share = -(-rows // pool.count)
            pool.run([lambda a=a: kernels.packed_product(form, data, None, x, a, min(a + share, rows),
                                                         out[:, a : min(a + share, rows)], quantized, mode=mode)
                      for a in range(0, rows, share)])


def measure(form: str, n: int, threads: int, repeats: int) -> dict:
    from kestrel_trio import _kernels

    rng = np.random.default_rng(0)
    layers = [[random_blocks(form, rng, rows, cols) for _, rows, cols in MATRICES] for _ in range(LAYERS)]
    x_of = {cols: rng.standard_normal((n, cols), dtype=np.float32) for cols in {c for _, _, c in MATRICES}}
    outs = {name: np.empty((n, rows), dtype=np.float32) for name, rows, _ in MATRICES}
    pool = Pool(threads) if threads > 1 else None
    best = {}
    kernel = {}
    try:
        for mode in ("exact", "integer"):  # compile or load both before timing
            kernel[mode] = _kernels.product_kernels([form], mode)[form]
            layer_step(_kernels, form, layers[0], x_of, outs, pool, mode)
        for _ in range(repeats):
            for mode in ("exact", "integer"):
                for layer in layers:
                    started, cpu_started = time.perf_counter(), time.process_time()
                    layer_step(_kernels, form, layer, x_of, outs, pool, mode)
                    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
                    best[mode] = min(best.get(mode, float("inf")), wall)
                    best[mode + "_cpu"] = min(best.get(mode + "_cpu", float("inf")), cpu)
    finally:
        if pool is not None:
            pool.stop()
    weight_bytes = sum(d.nbytes for d in layers[0])
    return {"form": form, "n": n, "threads": threads, "kernel": kernel, "exact_ms": best["exact"] * 1e3,
            "integer_ms": best["integer"] * 1e3, "exact_cpu_ms": best["exact_cpu"] * 1e3,
            "integer_cpu_ms": best["integer_cpu"] * 1e3, "gbps": weight_bytes / best["integer"] / 1e9}


AVX2_ENV = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forms", default="Q8_0,Q4_0,Q4_K,Q6_K")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--avx2", action="store_true", help="numba's code for an AVX2-only CPU (haswell)")
    args = parser.parse_args()
    if args.avx2 and any(os.environ.get(k) != v for k, v in AVX2_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **AVX2_ENV})

    from kestrel_trio import _kernels

    print(f"CPU vector flags: {cpu_vector_flags()}")
    print(f"numba compiles for: {_kernels.describe_cpu()} (NUMBA_CPU_NAME={os.environ.get('NUMBA_CPU_NAME')!r}, "
          f"NUMBA_CPU_FEATURES={os.environ.get('NUMBA_CPU_FEATURES')!r})")
    print(f"load average before: {load_average()}")
    print("one decode layer of Qwen3-0.6B (qkv 4096x1024, o 1024x2048, gate_up 6144x1024, down 1024x3072), "
          f"the shortest of {args.repeats} x {LAYERS} layers (wall clock, and the process's CPU time); ratio: "
          "exact / integer")
    print(f"{'form':6} {'rows':>4} {'thr':>3} {'exact kernel':>12} {'integer kernel':>14} {'exact ms':>9} "
          f"{'integer ms':>10} {'ratio':>6} {'exact cpu':>9} {'int cpu':>8} {'ratio':>6} {'int GB/s':>8}")
    for form in args.forms.split(","):
        for n in (int(v) for v in args.rows.split(",")):
            for threads in (int(v) for v in args.threads.split(",")):
                r = measure(form, n, threads, args.repeats)
                print(f"{form:6} {n:4d} {threads:3d} {r['kernel']['exact']:>12} {r['kernel']['integer']:>14} "
                      f"{r['exact_ms']:9.3f} {r['integer_ms']:10.3f} {r['exact_ms'] / r['integer_ms']:5.2f}x "
                      f"{r['exact_cpu_ms']:9.3f} {r['integer_cpu_ms']:8.3f} "
                      f"{r['exact_cpu_ms'] / r['integer_cpu_ms']:5.2f}x {r['gbps']:8.1f}", flush=True)
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
