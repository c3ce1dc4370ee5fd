"""The kernel plan (kestrel_trio._kernels.plan): which kernel each kind of work takes on a CPU, computed from its
features alone, for CPUs this host is not (the board's Cortex-A76 and A53, AVX2-only and AVX-512 x86-64), and on
this host the same choices the dispatch makes. Then every float32, bf16 and int8 row variant this host executes
(the plan's ``runnable``, not only the chosen one) against the portable loops."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._kernels import plan as kplan
from kestrel_trio._kernels.plan import SAMPLE_CPUS, Features, plan
from kestrel_trio._kernels.wrappers import prefill

from kernel_plan_kit import runnable
from slow_host import allowance

A76, A53, AVX2, AVX512 = (SAMPLE_CPUS[name] for name in SAMPLE_CPUS)
ALL_INTEGER = kplan.INTEGER_FORMS


def variants(found) -> dict[str, str]:
    return {kind: choice.variant for kind, choice in found.kinds().items()}


def test_the_boards_big_core_takes_sdot_and_portable_loops_elsewhere():
    found = plan(A76)
    assert variants(found) == {"f32": "portable", "bf16": "portable", "f16": "portable", "exact": "portable",
                               "integer": "neon-dotprod", "chunk_products": "none", "chunk_attention": "none",
                               "softmax": "portable", "tiles": "none"}
    assert found.integer.runnable == ("neon-dotprod", "neon", "portable")
    assert found.integer_auto == ALL_INTEGER


def test_a_core_without_dotprod_takes_the_widening_kernel():
    found = plan(A53)
    assert found.integer.variant == "neon" and found.integer.runnable == ("neon", "portable")
    assert found.integer_auto == ALL_INTEGER
    assert "neon-dotprod" not in found.integer.runnable  # LLVM could not even select sdot for it


def test_an_avx2_only_x86_takes_the_avx2_blocks_and_no_avx512_kernel():
    found = plan(AVX2)
    assert variants(found) == {"f32": "avx2", "bf16": "avx2", "f16": "portable", "exact": "portable",
                               "integer": "avx2", "chunk_products": "none", "chunk_attention": "avx2",
                               "softmax": "portable", "tiles": "none"}
    assert found.f32.runnable == ("avx2", "portable") and found.chunk_products.runnable == ()
    assert found.integer.runnable == ("avx2", "portable") and found.integer_auto == ALL_INTEGER


def test_an_avx512_vnni_x86_takes_every_avx512_kernel():
    found = plan(AVX512)
    assert variants(found) == {"f32": "avx512", "bf16": "avx2", "f16": "portable", "exact": "portable",
                               "integer": "avx512-vnni", "chunk_products": "avx512", "chunk_attention": "avx512",
                               "softmax": "avx512", "tiles": "none"}
    assert found.chunk_attention.runnable == ("avx512", "avx2")
    assert found.integer.runnable == ("avx512-vnni", "avx2", "portable")  # no AVX-VNNI: no {vex} 256-bit kernel
    assert "amx-tile" in found.tiles.why


def test_a_zen_with_avx512_takes_the_avx2_block_first_and_runs_the_rest():
    zen = dataclasses.replace(AVX512, cpu="znver5", runs=AVX512.runs | {"avxvnni"},
                              compiled=AVX512.compiled | {"avxvnni"})
    found = plan(zen)
    assert (found.f32.variant, found.chunk_products.variant, found.chunk_attention.variant) == (
        "avx2+avx512", "none", "avx2")
    assert found.f32.runnable == ("avx2+avx512", "avx512", "avx2", "portable")
    assert found.chunk_products.runnable == ("avx512",) and found.softmax.runnable == ("portable", "avx512")
    assert found.integer.runnable == ("avx512-vnni", "avx-vnni", "avx2", "portable")


def test_numbas_target_limits_the_assembly_to_what_its_code_holds():
    assert plan(dataclasses.replace(AVX512, target="haswell")).f32.variant == "avx2"
    assert plan(dataclasses.replace(AVX512, target="core2")).f32.variant == "portable"
    assert plan(dataclasses.replace(AVX512, target_features=frozenset({"avx2", "fma"}))).f32.variant == "avx2"
    assert plan(dataclasses.replace(AVX512, target_features=frozenset())).f32.variant == "portable"
    assert plan(dataclasses.replace(AVX512, compiled=frozenset({"avx2", "f16c"}))).integer.variant == "avx2"
    none = plan(dataclasses.replace(AVX512, compiled=frozenset()))
    assert none.integer.variant == "portable" and none.integer_auto == frozenset()


def test_amx_tiles_need_linux_and_both_features():
    spr = dataclasses.replace(AVX512, cpu="sapphirerapids", runs=AVX512.runs | {"amx-tile", "amx-bf16"})
    assert plan(spr).tiles.variant == "amx"
    assert plan(dataclasses.replace(spr, os="win32")).tiles.variant == "none"
    assert plan(dataclasses.replace(spr, runs=spr.runs - {"amx-bf16"})).tiles.why == \
        "this CPU has no amx-bf16 (sapphirerapids)"


def test_another_architecture_takes_the_portable_loops_only():
    found = plan(Features(arch="riscv64", os="linux", cpu="generic", runs=frozenset()))
    assert {c.variant for c in found.kinds().values()} <= {"portable", "none"} and found.integer_auto == frozenset()


def test_the_plan_probes_nothing(monkeypatch):
    """Pure: with every probe of the host broken, any CPU's plan is still made."""
    import llvmlite.binding as llvm_binding

    from kestrel_trio._kernels import cpu

    def broken(*args):
        raise AssertionError("plan() probed the host")

    for name in ("get_host_cpu_features", "get_host_cpu_name"):
        monkeypatch.setattr(llvm_binding, name, broken)
    for name in ("this_cpu", "kernel_features", "read_hwcaps"):
        monkeypatch.setattr(cpu, name, broken)
    for features in SAMPLE_CPUS.values():
        assert plan(features) == plan(features)


@pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason())
def test_this_hosts_plan_is_what_the_dispatch_runs():
    from kestrel_trio._kernels import dispatch
    from kestrel_trio._kernels import cpu

    found = kplan.this_plan()
    assert found == plan(cpu.kernel_features())
    assert dispatch.f32_assembly() == (None if found.f32.variant == "portable" else found.f32.variant)
    assert _kernels.product_kernels(["F32", "bf16", "int8", "F16"], "exact") == {
        "F32": kplan.F32_LABELS[found.f32.variant], "bf16": found.bf16.variant, "int8": found.bf16.variant,
        "F16": "portable"}
    assert (prefill._chunks_unusable() is None) == (found.chunk_products.variant == "avx512")
    assert (_kernels.enable_tiles() is None) <= (found.tiles.variant == "amx")
    integer = {kplan.INTEGER_LABELS[found.integer.variant]}
    assert set(_kernels.product_kernels(ALL_INTEGER, "integer").values()) == integer


def test_the_command_prints_the_four_reference_cpus_and_this_host():
    out = subprocess.run([sys.executable, "-m", "kestrel_trio._kernels.plan"], capture_output=True, text=True,
                         timeout=allowance(300))
    assert out.returncode == 0, out.stderr
    sections = out.stdout.strip().split("\n\n")
    assert len(sections) == len(SAMPLE_CPUS) + 1
    for section, (name, features) in zip(sections, SAMPLE_CPUS.items()):
        assert section == f"{name}:\n{plan(features).render()}"
    assert sections[-1].startswith("this host (")
    assert "  integer          neon-dotprod  neon, portable " in sections[0]  # the rendering, once by hand
    assert "  integer          neon          portable " in sections[1]


@pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason())
def test_the_commands_host_plan_is_this_processs():
    out = subprocess.run([sys.executable, "-m", "kestrel_trio._kernels.plan"], capture_output=True, text=True,
                         timeout=allowance(300))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().split("\n\n")[-1].split("\n", 1)[1] == kplan.this_plan().render()


# ---------------------------------------------------------------- every variant the host executes


def _each(kind: str, names) -> list:
    """``names`` as parameters, each not in this host's runnable variants of ``kind`` skipped (marked host_cpu)."""
    return [pytest.param(name, marks=[pytest.mark.host_cpu, pytest.mark.skipif(
        name not in runnable(kind), reason=f"this host does not execute {kind} variant {name}")]) for name in names]


def _compiled(function):
    from numba import njit

    return njit(nogil=True)(function)


@pytest.mark.parametrize("variant", _each("f32", ["avx512", "avx2+avx512", "avx2"]))
@pytest.mark.parametrize("rows_in", [4, 5, 7, 8, 12, 13, 15, 16, 19, 24, 31, 32])  # 12 up: the 6x4 zmm block
@pytest.mark.parametrize("cols", [1040, 40, 36])  # 40: of 8 (AVX2's lanes), not 16; 36: of neither
def test_every_float32_variant_the_host_runs_equals_the_portable_loops(variant, rows_in, cols):
    from kestrel_trio._kernels import dispatch
    from kestrel_trio._kernels.portable import products
    from kestrel_trio._kernels.x86.float32 import blocks as f32_blocks

    dispatch.f32_assembly()  # readies LLVM's assembly parser (the blocks are assembly)
    product = _compiled({"avx512": f32_blocks.product_f32_avx512,
                         "avx2+avx512": f32_blocks.product_f32_avx2_avx512,
                         "avx2": f32_blocks.product_f32_avx2}[variant])
    reference = _compiled(products.product_f32)
    rng = np.random.default_rng(rows_in + cols)
    weights = rng.standard_normal((23, cols), dtype=np.float32)  # [23, in]
    x = rng.standard_normal((rows_in, cols), dtype=np.float32)  # [N, in]
    got, want = (np.full((rows_in, 22), np.nan, dtype=np.float32) for _ in range(2))  # [N, 22]
    product(weights, None, None, None, x, 1, 22, got[:, 1:22])
    reference(weights, None, None, None, x, 1, 22, want[:, 1:22])
    scale = np.abs(x) @ np.abs(weights[1:22]).T  # [N, 21]: each sum's terms' size
    assert np.all(np.abs(got[:, 1:22] - want[:, 1:22]) <= 2e-6 * scale + 1e-30)
    assert np.isnan(got[:, 0]).all() and not np.isnan(got[:, 1:22]).any()


@pytest.mark.parametrize("variant", _each("bf16", ["avx2"]))
@pytest.mark.parametrize("rows_in", [4, 5, 8, 13])
@pytest.mark.parametrize("form", ["bf16", "int8"])
def test_every_bf16_and_int8_variant_the_host_runs_equals_the_portable_loops(variant, rows_in, form):
    from kestrel_trio._kernels import dispatch
    from kestrel_trio._kernels.portable import products
    from kestrel_trio._kernels.x86.float32 import blocks as f32_blocks

    dispatch.f32_assembly()
    rng = np.random.default_rng(rows_in)
    cols = 520
    if form == "bf16":
        data = (rng.standard_normal((23, cols), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        scales = np.empty((23, 0), dtype=np.uint8)  # [rows, 0]
        product, reference = f32_blocks.product_bf16_avx2, products.product_bf16
    else:
        data = rng.integers(-127, 128, (23, cols), dtype=np.int8)  # [rows, in]
        scales = rng.uniform(0.001, 0.02, (23, 1)).astype(np.float32)  # [rows, 1]
        product, reference = f32_blocks.product_int8_avx2, products.product_int8
    x = rng.standard_normal((rows_in, cols), dtype=np.float32)  # [N, in]
    table = products.f16_table()  # [65536]
    got, want = (np.empty((rows_in, 21), dtype=np.float32) for _ in range(2))  # [N, 21]
    _compiled(product)(data, scales, table, 32, x, 1, 22, got)
    _compiled(reference)(data, scales, table, 32, x, 1, 22, want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
