"""Helpers shared by the model benchmarks: process memory, the BLAS in use, the CPU's vector flags, bandwidth.

Everything here runs inside one measured process; nothing imports torch.
"""

from __future__ import annotations

import os
import sys
import time

OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def status_bytes(field: str) -> int:
    """A /proc/self/status memory field (VmHWM, VmRSS, ...) in bytes.

    VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork + exec.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def blas_description() -> str:
    """numpy's BLAS as threadpoolctl sees it: library, version, kernel (core type), threads."""
    import numpy  # noqa: F401  (loads the BLAS so threadpoolctl can see it)
    import threadpoolctl

    found = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    if not found:
        return "no BLAS found by threadpoolctl"
    i = found[0]
    spin = sys.modules.get("kestrel_trio.blas_spin")  # how long idle BLAS threads spin (kestrel's side only)
    return (
        f"{i.get('internal_api')} {i.get('version')} kernel={i.get('architecture', '?')} "
        f"threads={i.get('num_threads')} ({os.path.basename(i.get('filepath', ''))})"
        + (f", idle threads: {spin.spin_timeout()}" if spin is not None else "")
    )


# OpenBLAS core types -> the LLVM CPU that numba compiles kestrel_trio's fused products for: a side run under
# OPENBLAS_CORETYPE=Haswell gets AVX2 code from numba as well (NUMBA_CPU_NAME), as an AVX2-only CPU would.
NUMBA_CPU_FOR_KERNEL = {"Haswell": "haswell", "SkylakeX": "skylake-avx512"}


def compiled_kernels_description() -> str:
    """The compiler of kestrel's fused products and the CPU it compiles for (numba, LLVM)."""
    try:
        import numba
        from llvmlite import binding
    except ImportError as error:
        return f"numba not importable ({error}): numpy products"
    target = os.environ.get("NUMBA_CPU_NAME") or f"host ({binding.get_host_cpu_name()})"
    from kestrel_trio._kernels import dispatch

    f32 = {"avx512": "AVX-512 assembly blocks", "avx2": "AVX2 assembly block",
           "avx2+avx512": "AVX2 assembly block, AVX-512 6x4 block from 12 rows"}.get(
        dispatch.f32_assembly(), "compiled loops")
    return f"numba {numba.__version__} compiling for {target}; float32 rows from 4 up: {f32}"


def load_average() -> str:
    """The 1-minute load average and the CPU count: how busy the machine is while a figure is measured."""
    return f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus"


def blas_threads() -> int:
    """How many threads numpy's BLAS uses now."""
    import numpy  # noqa: F401
    import threadpoolctl

    found = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    return int(found[0]["num_threads"]) if found else 1


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> dict[str, float]:
    """Memory read bandwidth in bytes/s, measured two ways with numpy.

    ``sum``: one thread streaming through ``gib`` GiB of float32.
    ``gemv``: the same bytes as a [rows, 1024] matrix times a vector (BLAS,
    all its threads): the access pattern of a batch-1 decode step.
    """
    import numpy as np

    n = int(gib * 2**30) // 4
    data = np.ones(n, dtype=np.float32)  # [n]
    matrix = data.reshape(-1, 1024)  # [n/1024, 1024]
    vector = np.ones(1024, dtype=np.float32)  # [1024]
    out = np.empty(matrix.shape[0], dtype=np.float32)  # [n/1024]
    best = {"sum": float("inf"), "gemv": float("inf")}
    for _ in range(repeats):
        started = time.perf_counter()
        data.sum()
        best["sum"] = min(best["sum"], time.perf_counter() - started)
        started = time.perf_counter()
        np.matmul(matrix, vector, out=out)
        best["gemv"] = min(best["gemv"], time.perf_counter() - started)
    return {way: data.nbytes / seconds for way, seconds in best.items()}


_VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                 "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
                 "asimd", "asimdhp", "asimddp", "fphp", "sve", "sve2", "bf16", "i8mm")


def run_without_openblas_overrides(keep: bool) -> None:
    """Re-execute this script without OPENBLAS_OVERRIDES (unless ``keep``), so OpenBLAS picks its own kernel.

    The names and values unset go in KESTREL_BENCH_UNSET for :func:`openblas_overrides_note`.
    """
    overridden = [name for name in OPENBLAS_OVERRIDES if name in os.environ]
    if overridden and not keep:
        env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_OVERRIDES}
        env["KESTREL_BENCH_UNSET"] = ", ".join(f"{n}={os.environ[n]}" for n in overridden)
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


# What an AVX2-only x86 CPU (Zen 2/3, Haswell to Comet Lake) runs, for every side of a benchmark on a CPU with
# AVX-512: OpenBLAS's Haswell kernels, numba's AVX2 code, and PyTorch's AVX2 kernels (ATen's dispatch, MKL's
# and oneDNN's instruction sets). Without the last three the PyTorch side keeps its AVX-512 code.
# NUMBA_CPU_FEATURES empty: with the name alone numba adds the host's features (AVX-512 included) to every loop
# it vectorizes itself; only the hand-written kernels kept to AVX2.
AVX2_MACHINE_ENV = {
    "OPENBLAS_CORETYPE": "Haswell", "NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "",
    "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
}


def run_as_avx2_machine() -> None:
    """Re-execute this script with AVX2_MACHINE_ENV (unless it is set already): every side runs AVX2 code."""
    if any(os.environ.get(name) != value for name, value in AVX2_MACHINE_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **AVX2_MACHINE_ENV})


def openblas_overrides_note() -> str:
    """What became of the machine's OPENBLAS_OVERRIDES in this run, for a benchmark's header."""
    unset = os.environ.get("KESTREL_BENCH_UNSET")
    return f"unset for this run ({unset})" if unset else "as in the environment"


def cpu_vector_flags() -> str:
    """The vector-instruction flags /proc/cpuinfo reports for the first CPU (x86 ``flags``, Arm ``Features``)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    present = set(value.split())
                    return " ".join(flag for flag in _VECTOR_FLAGS if flag in present) or "none of the known ones"
    except OSError:
        pass
    return "unknown (no /proc/cpuinfo)"


def best_of(runs: int, fn) -> float:
    """The shortest of ``runs`` timings of ``fn()``, in seconds."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def fma_peak(threads: int, seconds: float = 0.3) -> tuple[float, str] | None:
    """This machine's float32 multiply-add peak, GFLOP/s over ``threads`` threads, and the vectors it ran on.

    A loop of independent ``vfmadd231ps`` on registers (no loads, no stores):
    the rate no float32 product can beat on these cores, at the clock they
    hold while all of them run. zmm where kestrel's products may use AVX-512,
    ymm where only AVX2 (``--avx2``); None where they run no assembly (not
    x86-64, or numba missing).
    """
    import threading

    try:
        from kestrel_trio._kernels.dispatch import f32_assembly
    except ImportError:
        return None
    form = f32_assembly()
    if form is None:
        return None
    vector, sums, lanes = ("zmm", 24, 16) if "avx512" in form else ("ymm", 12, 8)
    loop = _fma_loop(vector, sums)
    loop(1000)  # compile before timing
    iterations = 1 << 16
    while True:  # grow the loop to ``seconds`` on one thread (warms the clock up too)
        started = time.perf_counter()
        loop(iterations)
        if time.perf_counter() - started > seconds / 4:
            break
        iterations *= 2
    iterations = int(iterations * seconds / max(time.perf_counter() - started, 1e-9))
    best = 0.0
    for _ in range(3):
        workers = [threading.Thread(target=loop, args=(iterations,)) for _ in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        best = max(best, threads * iterations * sums * lanes * 2 / (time.perf_counter() - started) / 1e9)
    return best, f"{sums} independent {vector} vfmadd231ps a loop, {threads} threads"


def _fma_loop(vector: str, sums: int):
    """A numba function (nogil) running ``iterations`` times ``sums`` independent vector multiply-adds."""
    from numba import njit, types
    from numba.extending import intrinsic

    from kestrel_trio._kernels.x86.float32.assembly import _asm_codegen

    zero = "vpxord" if vector == "zmm" else "vpxor"
    registers = [f"{vector}{i}" for i in range(sums + 2)]
    text = "\n".join([f"{zero} %{r}, %{r}, %{r}" for r in registers] + ["mov $0, %rcx", "1:"]
                     + [f"vfmadd231ps %{registers[-2]}, %{registers[-1]}, %{r}" for r in registers[:sums]]
                     + ["dec %rcx", "jnz 1b", "vzeroupper"])

    @intrinsic
    def fma_block(typingctx, iterations):
        return types.void(types.int64), _asm_codegen(text, registers)

    @njit(nogil=True)
    def loop(iterations):
        fma_block(iterations)

    return loop
