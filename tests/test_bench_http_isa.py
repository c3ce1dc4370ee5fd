"""benchmarks/llama_cpp/bench_http.py's ``--isa avx2``: the environment that holds kestrel to an AVX2-only CPU's code,
and the checks that stop a run whose sides are not held to it."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks" / "llama_cpp"
sys.path.insert(0, str(BENCHMARKS))
import bench_http  # noqa: E402

# llama-server's start-up line, as c9ced49 writes it: a native build on an AVX-512 Zen 5, and an AVX2-only build.
NATIVE_LINE = ("system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | "
               "AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | "
               "AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
AVX2_LINE = ("system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | "
             "AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")


def test_native_keeps_the_environment():
    environ = {"PATH": "/bin", "OPENBLAS_L2_SIZE": "512"}
    assert bench_http.isa_environment("native", environ, False, Path("/c")) == environ


def test_avx2_sets_haswell_an_own_numba_cache_and_drops_the_l2_override():
    environ = {"PATH": "/bin", "OPENBLAS_CORETYPE": "SkylakeX", "OPENBLAS_L2_SIZE": "512", "NUMBA_CPU_NAME": "znver5"}
    env = bench_http.isa_environment("avx2", environ, False, Path("/c"))
    assert env == {"PATH": "/bin", "OPENBLAS_CORETYPE": "Haswell", "NUMBA_CPU_NAME": "haswell",
                   "NUMBA_CPU_FEATURES": "", "NUMBA_CACHE_DIR": "/c/numba-haswell"}
    assert bench_http.isa_environment("avx2", environ, True, Path("/c"))["OPENBLAS_L2_SIZE"] == "512"
    # applied twice, the same: the re-executed run does not execute itself again
    assert bench_http.isa_environment("avx2", env, False, Path("/c")) == env


def test_an_unknown_isa_is_refused_by_name():
    with pytest.raises(ValueError, match="avx512"):
        bench_http.isa_environment("avx512", {}, False, Path("/c"))


def test_llama_system_info_reads_the_feature_flags():
    info = bench_http.llama_system_info("load_backend: x\n" + NATIVE_LINE + "\nmain: loading model\n")
    assert info["AVX512"] == "1" and info["AVX_VNNI"] == "1" and info["SSE3"] == "1"
    assert "n_threads" not in " ".join(info)
    assert bench_http.llama_system_info("no such line\n") == {}


def test_isa_violations_name_every_side_that_is_not_avx2():
    avx2_products = {"Q4_K": "avx2", "Q6_K": "avx2", "F32": "avx2"}
    clean = bench_http.isa_violations("avx2", avx2_products, bench_http.llama_system_info(AVX2_LINE), "Haswell")
    assert clean == []
    wrong = bench_http.isa_violations("avx2", {"Q4_K": "vnni", "F32": "avx2+avx512"},
                                      bench_http.llama_system_info(NATIVE_LINE), "Zen")
    assert "kestrel-trio's Q4_K products take vnni" in wrong
    assert "kestrel-trio's F32 products take avx2+avx512" in wrong
    assert "llama-server has AVX512 = 1" in wrong and "llama-server has AVX_VNNI = 1" in wrong
    assert "OpenBLAS runs its Zen kernel, not Haswell's" in wrong
    assert bench_http.isa_violations("avx2", avx2_products, {}, "Haswell") == [
        "llama-server's log has no system_info line to check its instruction sets by"]
    assert bench_http.isa_violations("native", {"Q4_K": "vnni"}, {}, "Zen") == []


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64's instruction sets")
def test_the_avx2_environment_holds_kestrels_plan_and_openblas_to_haswell(tmp_path):
    """In a process started with the --isa avx2 environment (as kestrel's server is), the kernel plan takes the AVX2
    kernels and OpenBLAS its Haswell ones, whatever this CPU has beyond AVX2."""
    machine = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "NUMBA_"))}
    env = bench_http.isa_environment("avx2", machine, False, tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(bench_http.__file__).resolve().parents[2] / "src"),
                                         env.get("PYTHONPATH", "")])
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import bench_http; "
            "from numba.core import config; from kestrel_trio._kernels.plan import this_plan; p = this_plan(); "
            "print(json.dumps([p.f32.variant, p.integer.variant, bench_http.blas_kernel(), config.CPU_NAME, "
            "config.CPU_FEATURES]))")
    done = subprocess.run([sys.executable, "-c", code, str(BENCHMARKS)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    f32, integer, blas, name, features = json.loads(done.stdout.strip().splitlines()[-1])
    assert (f32, integer) == ("avx2", "avx2")
    assert blas == "Haswell"
    assert (name, features) == ("haswell", "")  # "", not None: numba adds none of the host's features
