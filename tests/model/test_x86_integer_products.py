"""x86-64's integer products (kestrel_trio._kernels.x86.integer): each kernel this host can run bit-equal to the
portable reference (_kernels.portable.integer) on random blocks, extreme scales, zero blocks, odd row counts,
row ranges and 1-16 activation rows; their instructions in the generated code; which kernel the dispatch names
for each form and mode; and the choice for code compiled for another CPU (NUMBA_CPU_NAME)."""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

from kestrel_trio import _kernels

# host_cpu: on another architecture (the aarch64 lane) these skip, and CI=true lets them (tests/conftest.py).
pytestmark = [pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason()),
              pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64's kernels"), pytest.mark.host_cpu]

if _kernels.ready() and platform.machine() == "x86_64":
    from kestrel_trio._kernels import dispatch
    from kestrel_trio._kernels import cpu, plan
    from kestrel_trio._kernels.portable import integer
    from kestrel_trio._kernels.portable.products import f16_table
    from kestrel_trio._kernels.x86 import integer as x86

from test_integer_products import BLOCK_BYTES, FORMS, HALVES, block_rows, quantized, sums_of  # noqa: E402

DRIVERS = {"vnni512": "product_vnni512", "vnni256": "product_vnni256", "avx2": "product_avx2"}


def runnable() -> list[str]:
    """The kinds of x86 kernel this host runs and numba's code holds: the plan's runnable variants (the best one
    and every narrower one)."""
    from kestrel_trio._kernels.plan import this_plan

    return [kind for kind, variant in PLAN_VARIANTS.items() if variant in this_plan().integer.runnable]


# x86.usable_kernel's kinds -> the plan's variants (kestrel_trio._kernels.plan).
PLAN_VARIANTS = {"vnni512": "avx512-vnni", "vnni256": "avx-vnni", "avx2": "avx2"}
_RUNNABLE = runnable() if _kernels.ready() and platform.machine() == "x86_64" else []
# Each kind as a parameter, those this host cannot run skipped with the reason (the module is marked host_cpu).
EACH_KIND = [pytest.param(kind, marks=pytest.mark.skipif(kind not in _RUNNABLE, reason=f"this host cannot run {kind}"))
             for kind in PLAN_VARIANTS]


def extreme(form: str, data: np.ndarray, rng) -> np.ndarray:
    """``data`` with some blocks' float16 scales at the extremes (65504, subnormal 6e-8, zero, negative)."""
    blocks = data.reshape(data.shape[0], -1, BLOCK_BYTES[form]).copy()  # [rows, blocks, bytes]
    values = np.array([65504.0, 6e-8, 0.0, -3.5, 1e-3], dtype=np.float16)
    picks = rng.integers(0, len(values), blocks.shape[:2])  # [rows, blocks]
    chosen = rng.random(blocks.shape[:2]) < 0.3
    for which, at in enumerate(HALVES[form]):  # d; and m or dmin, drawn the other way round
        drawn = values if which == 0 else values[::-1]
        blocks[chosen, at : at + 2] = drawn[picks[chosen]].reshape(-1, 1).view(np.uint8)
    if form == "Q6_K":  # its int8 scales at their extremes too
        blocks[chosen, 192:194] = np.array([-128, 127], dtype=np.int8).view(np.uint8)
    return blocks.reshape(data.shape)


def activations(rng, n: int, cols: int) -> np.ndarray:
    """[n, cols]: normal values, a block of zeros, a block of large ones, a block with a single non-zero."""
    x = rng.standard_normal((n, cols), dtype=np.float32)
    x[0, 0:32] = 0.0
    if cols >= 96:
        x[-1, 32:64] *= np.float32(1e30)
        x[-1, 64:96] = 0.0
        x[-1, 70] = -1e-30
    return x


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("n", "rows", "cols", "start"), [
    (1, 13, 1024, 0), (2, 4, 768, 3), (3, 9, 2048, 1), (4, 8, 256, 2), (5, 7, 512, 0), (8, 16, 512, 5),
    (16, 5, 256, 1), (1, 1, 256, 0), (7, 3, 256, 4), (6, 21, 512, 2), (9, 12, 256, 1),
])
@pytest.mark.parametrize("kind", EACH_KIND)
def test_every_x86_kernel_equals_the_reference_bit_for_bit(kind, form, n, rows, cols, start):
    rng = np.random.default_rng(rows * cols + n + start)
    data = extreme(form, block_rows(form, rng, start + rows + 2, cols), rng)  # [start + rows + 2, ...]
    xq, xd = quantized(activations(rng, n, cols))
    xs = sums_of(xq, xd)
    assert np.abs(xq.astype(np.int32)).max() <= 127  # the sign and offset tricks rely on it
    want = np.empty((n, rows), dtype=np.float32)
    integer.product_blocks(x86.form_id(form), data, f16_table(), 32, xq, xd, xs, start, start + rows, want)
    out = np.full((n, rows + 2), np.nan, dtype=np.float32)
    getattr(x86, DRIVERS[kind])(x86.form_id(form), data, xq, xd, xs, start, start + rows, out[:, 1 : 1 + rows])
    np.testing.assert_array_equal(out[:, 1 : 1 + rows].view(np.uint32), want.view(np.uint32), err_msg=kind)
    assert np.isnan(out[:, 0]).all() and np.isnan(out[:, -1]).all()


def _assembly(kernel) -> str:
    """``kernel``'s assembly compiled afresh (a kernel loaded from numba's cache has none to inspect)."""
    fresh = numba.njit(nogil=True)(kernel.py_func)
    rng = np.random.default_rng(1)
    data = block_rows("Q4_0", rng, 5, 256)
    xq, xd = quantized(rng.standard_normal((1, 256), dtype=np.float32))
    fresh(1, data, xq, xd, xd, 0, 5, np.empty((1, 5), dtype=np.float32))
    return "\n".join(fresh.inspect_asm().values())


@pytest.mark.parametrize("kind", EACH_KIND)
def test_the_kernels_compile_to_their_instructions(kind):
    text = _assembly(getattr(x86, DRIVERS[kind]))
    if kind == "vnni512":
        assert "vpdpbusd\t%zmm" in text  # four rows a zmm
    elif kind == "vnni256":
        assert "vpdpbusd\t%ymm" in text
    else:
        assert "vpmaddubsw" in text and "vpmaddwd" in text and "vpdpbusd" not in text


def test_the_choice_follows_the_code_numba_compiles_and_the_cpu():
    everything = {"avx2", "avxvnni", "avx512vnni"}.__contains__
    assert x86.usable_kernel(everything, x86.compiled_features("sapphirerapids", "")) == "vnni512"
    assert x86.usable_kernel(everything, x86.compiled_features("alderlake", "")) == "vnni256"
    assert x86.usable_kernel(everything, x86.compiled_features("haswell", "")) == "avx2"
    assert x86.usable_kernel(everything, x86.compiled_features("znver3", "")) == "avx2"
    assert x86.usable_kernel(everything, x86.compiled_features("x86-64", "")) is None
    assert x86.usable_kernel(everything, x86.compiled_features("sapphirerapids", "-avx512vnni,-avxvnni")) == "avx2"
    # code holding {vex} vpdpbusd on a CPU without AVX-VNNI (an AVX-512 VNNI Xeon): not that kernel
    assert x86.usable_kernel({"avx2", "avx512vnni"}.__contains__, x86.compiled_features("alderlake", "")) == "avx2"
    assert x86.usable_kernel({"avx2"}.__contains__, x86.compiled_features("sapphirerapids", "")) == "avx2"
    assert x86.usable_kernel(set().__contains__, x86.compiled_features("haswell", "")) is None


def test_the_dispatch_names_each_forms_kernel_in_each_mode(monkeypatch):
    own = x86.KINDS[x86.usable_kernel(cpu.this_cpu().has)]
    forms = FORMS + ["bf16"]
    assert plan.X86_AUTO_FORMS == frozenset(x86.FORMS) == frozenset(FORMS)  # auto takes every x86 kernel
    assert plan.this_plan().integer_auto == plan.X86_AUTO_FORMS
    assert all(name in ("portable", "avx2", "avx512") for name in _kernels.product_kernels(forms, "exact").values())
    assert {f: _kernels.product_kernels([f], "exact")[f] for f in FORMS} == {f: "portable" for f in FORMS}
    for mode in ("auto", "integer"):
        found = _kernels.product_kernels(forms, mode)
        assert {f: found[f] for f in FORMS} == {f: own for f in FORMS}
    # a form the x86 module has no kernel for: the exact path in auto, the portable reference in integer
    monkeypatch.setattr(x86, "FORMS", {f: v for f, v in x86.FORMS.items() if f != "Q6_K"})
    assert _kernels.product_kernels(["Q6_K", "Q4_0"], "auto") == {"Q6_K": "portable", "Q4_0": own}
    assert _kernels.product_kernels(["Q6_K"], "integer") == {"Q6_K": "int8"}
    # and a form auto does not take on x86 (where it would not win): the plan says which it takes
    monkeypatch.setattr(plan, "_found", [dataclasses.replace(plan.this_plan(), integer_auto=frozenset({"Q8_0"}))])
    assert _kernels.product_kernels(["Q8_0", "Q4_K"], "auto") == {"Q8_0": own, "Q4_K": "portable"}


def test_a_product_through_the_dispatch_equals_the_reference():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 512), dtype=np.float32)  # [6, 512]
    xq, xd = quantized(x)
    for form in FORMS:
        data = block_rows(form, rng, 11, 512)  # [11, ...]
        want = np.empty((6, 11), dtype=np.float32)
        integer.product_blocks(x86.form_id(form), data, f16_table(), 32, xq, xd, sums_of(xq, xd), 0, 11, want)
        out = np.empty((6, 11), dtype=np.float32)
        shared = _kernels.quantize_activations(x, [form], "auto")  # x86-64's kernels, every form (X86_AUTO_FORMS)
        _kernels.packed_product(form, data, None, x, 0, 11, out, shared, mode="auto")
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
        # read-only rows (a mapped GGUF) into a column range of a larger result: the same kernel, no other
        data.flags.writeable = False
        wider = np.full((6, 13), np.nan, dtype=np.float32)  # [6, 13]
        _kernels.packed_product(form, data, None, x, 0, 11, wider[:, 1:12], mode="auto")
        np.testing.assert_array_equal(wider[:, 1:12].view(np.uint32), want.view(np.uint32))
        assert np.isnan(wider[:, 0]).all() and np.isnan(wider[:, 12]).all()
    # one compiled version a kernel, made at first use: no call compiled another (after warming, none may)
    assert dispatch._typed_kernels and all(len(k.signatures) == 1 for k in dispatch._typed_kernels.values())


AVX2_CHILD = """
import numpy as np, sys
sys.path.insert(0, {tests!r})
from test_integer_products import block_rows, quantized, sums_of
from kestrel_trio import _kernels
from kestrel_trio._kernels.portable import integer
from kestrel_trio._kernels.portable.products import f16_table
from kestrel_trio._kernels.x86 import integer as x86
print(_kernels.product_kernels(["Q4_0"], "integer")["Q4_0"])
rng = np.random.default_rng(4)
data = block_rows("Q4_0", rng, 9, 256)
x = rng.standard_normal((5, 256), dtype=np.float32)
xq, xd = quantized(x)
want = np.empty((5, 9), dtype=np.float32)
integer.product_blocks(1, data, f16_table(), 32, xq, xd, sums_of(xq, xd), 0, 9, want)
out = np.empty((5, 9), dtype=np.float32)
_kernels.packed_product("Q4_0", data, None, x, 0, 9, out, mode="integer")
print(np.array_equal(out.view(np.uint32), want.view(np.uint32)))
"""


@pytest.mark.host_cpu
def test_numba_told_haswell_takes_the_avx2_kernel(tmp_path):
    """NUMBA_CPU_NAME=haswell (its own numba cache, so nothing compiled for this host is reused)."""
    if not cpu.this_cpu().has("avx2"):
        pytest.skip("no AVX2")
    env = {**os.environ, "NUMBA_CPU_NAME": "haswell", "NUMBA_CACHE_DIR": str(tmp_path)}
    env.pop("NUMBA_CPU_FEATURES", None)
    done = subprocess.run([sys.executable, "-c", AVX2_CHILD.format(tests=str(Path(__file__).parent))], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["avx2", "True"]
