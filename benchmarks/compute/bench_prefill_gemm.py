"""kestrel's float32 prefill-chunk kernel next to numpy's BLAS, on Qwen3-0.6B's layer shapes.

Usage:
    python benchmarks/compute/bench_prefill_gemm.py [--rows 64,128,256,384,512] [--repeats 7] [--keep-openblas-env]

On Intel's AVX-512 CPUs, kestrel multiplies float32 weights by prefill chunks
of 33 to ``CHUNK_KERNEL_MAX_ROWS`` rows in its own kernel
(kestrel_trio._kernels.x86.float32.chunks), and by more rows with BLAS. This times
both ways on the same inputs in one process, each product warm, best of
``--repeats``, on kestrel's product threads (``set_blas_threads``: 2 on a
2-core machine) and on BLAS's own: GFLOP/s of each, their ratio per shape
and for one layer's products, and each one's largest error against a
float64 product, relative to the largest value. Run it on a new CPU to place
``CHUNK_KERNEL_MAX_ROWS`` (where the ratio falls below 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _bench_common import (  # noqa: E402
    best_of, blas_description, blas_threads, cpu_vector_flags, fma_peak, load_average,
    run_without_openblas_overrides,
)

SHAPES = {"qkv_proj": (4096, 1024), "o_proj": (1024, 2048), "gate_up_proj": (6144, 1024), "down_proj": (1024, 3072)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="64,128,256,384,512",
                        help="activation rows (a prefill chunk), comma-separated")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--keep-openblas-env", action="store_true", help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE")
    args = parser.parse_args()
    run_without_openblas_overrides(args.keep_openblas_env)
    import kestrel_trio  # noqa: F401  (before numpy: OPENBLAS_THREAD_TIMEOUT)
    import numpy as np
    from kestrel_trio import _kernels
    from kestrel_trio._model.products.matmul import CHUNK_KERNEL_MAX_ROWS, run_shared, shares_of
    from kestrel_trio.model import set_blas_threads

    threads = blas_threads()
    set_blas_threads(threads)
    print(f"machine: load average {load_average()}; CPU vector flags: {cpu_vector_flags()}")
    print(f"numpy BLAS: {blas_description()}")
    reason = _kernels.enable_chunk_products()
    if reason is not None:
        print(f"kestrel's chunk kernel does not run here: {reason}")
        return
    peak = fma_peak(threads)
    print(f"float32 FMA peak: {peak[0]:.0f} GFLOP/s ({peak[1]}); kestrel takes the kernel up to "
          f"{CHUNK_KERNEL_MAX_ROWS} rows")
    rng = np.random.default_rng(0)
    for rows in [int(r) for r in args.rows.split(",")]:
        totals = {"BLAS": 0.0, "kernel": 0.0}
        gflop_layer = 0.0
        for name, (n, k) in SHAPES.items():
            w = rng.standard_normal((n, k), dtype=np.float32)  # [out, in]
            x = rng.standard_normal((rows, k), dtype=np.float32)  # [rows, in]
            ways = {"BLAS": lambda: x @ w.T, "kernel": lambda: _kernels.chunk_product(x, w, run_shared, shares_of)}
            exact = x.astype(np.float64) @ w.T.astype(np.float64)  # [rows, out]
            errors = {way: np.abs(call() - exact).max() / np.abs(exact).max() for way, call in ways.items()}
            best = {way: best_of(args.repeats, call) for way, call in ways.items()}
            gflop = 2 * rows * n * k / 1e9
            gflop_layer += gflop
            for way in totals:
                totals[way] += best[way]
            print(f"{rows:4d} rows {name:12s} [{n}, {k}]: BLAS {gflop / best['BLAS']:5.0f}, kernel "
                  f"{gflop / best['kernel']:5.0f} GFLOP/s ({best['BLAS'] / best['kernel']:.2f}x); error / max: "
                  f"BLAS {errors['BLAS']:.1e}, kernel {errors['kernel']:.1e}", flush=True)
        print(f"{rows:4d} rows, one layer's products: BLAS {gflop_layer / totals['BLAS']:.0f}, kernel "
              f"{gflop_layer / totals['kernel']:.0f} GFLOP/s ({totals['BLAS'] / totals['kernel']:.2f}x)")


if __name__ == "__main__":
    main()
