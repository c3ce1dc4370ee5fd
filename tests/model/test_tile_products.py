"""bf16 tile products (AMX) for prefill: exact to the bf16-rounded float32 product where the CPU has them, a clear
refusal where it does not (kestrel_trio._kernels.x86.tiles, kestrel_trio._model.products.matmul)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._kernels import loaded
from kestrel_trio._model.products import matmul
from kestrel_trio.errors import ModelLoadError
from kestrel_trio.model import load_model, prefill_precision, set_prefill_precision
from slow_host import allowance

FP32_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_fp32"


@pytest.fixture(autouse=True)
def _float32_prefill_after():
    yield
    set_prefill_precision("fp32")


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bf16 (nearest even), as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return (rounded << np.uint32(16)).astype(np.uint32).view(np.float32)


def _serially(tasks):
    for task in tasks:
        task()


_NO_TILES = _kernels.enable_tiles()  # None where this CPU and OS run AMX tiles, else why not
needs_tiles = pytest.mark.skipif(_NO_TILES is not None, reason=f"no AMX tiles here: {_NO_TILES}")


@pytest.mark.host_cpu
@pytest.mark.skipif(_NO_TILES is None, reason="this host has AMX tiles: test_a_cpu_without_tiles_is_refused_with_its_"
                                              "reason plays a CPU without them")
def test_a_host_without_tiles_refuses_bf16_prefill_and_keeps_float32():
    with pytest.raises(ModelLoadError, match="bf16 prefill needs AMX tiles"):
        set_prefill_precision("bf16")
    assert prefill_precision() == "fp32"


@pytest.mark.parametrize("weights", ["fp32", "bf16"])
@pytest.mark.host_cpu
@pytest.mark.skipif(_NO_TILES is None, reason="this host has AMX tiles")
def test_a_host_without_tiles_refuses_bf16_prefill_at_load(weights):
    with pytest.raises(ModelLoadError, match="bf16 prefill needs AMX tiles"):
        load_model(FP32_FIXTURE, weights=weights, prefill_precision="bf16")
    assert prefill_precision() == "fp32"


@pytest.mark.host_cpu
@needs_tiles
def test_tiles_give_the_bf16_rounded_product():
    rng = np.random.default_rng(7)
    for m, n, k in [(1, 32, 32), (17, 64, 96), (33, 96, 64), (100, 128, 2048)]:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        expected = _bf16(x) @ _bf16(w).T  # [m, n]: products of bf16 values are exact in float32
        for shares in (lambda blocks: [(0, blocks)], lambda blocks: [(0, blocks // 2), (blocks // 2, blocks)]):
            got = _kernels.tile_product(x, [w], _serially, shares)  # [m, n]
            assert got.shape == (m, n) and got.dtype == np.float32
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
        assert not np.allclose(got, x @ w.T, rtol=1e-6, atol=0)  # not the float32 product: the check has teeth


def test_a_cpu_without_tiles_is_refused_with_its_reason(monkeypatch):
    monkeypatch.delitem(loaded._state, "tiles", raising=False)
    monkeypatch.setitem(loaded._state, "tiles_error", "this CPU has no amx-tile or amx-bf16 (znver3)")
    with pytest.raises(ModelLoadError, match=r"bf16 prefill needs AMX tiles: this CPU has no amx-tile"):
        load_model(FP32_FIXTURE, weights="fp32", prefill_precision="bf16")
    with pytest.raises(ModelLoadError, match="unknown prefill precision 'fp16'"):
        set_prefill_precision("fp16")
    assert prefill_precision() == "fp32"


@pytest.mark.host_cpu
@needs_tiles
@pytest.mark.parametrize(("weights", "products_a_layer", "qkv_products"),
                         [("fp32", 4, 1), ("bf16", 7, 3)])  # bf16: each q/k/v, gate/up part
def test_bf16_prefill_runs_its_chunks_on_tiles_and_keeps_decode_in_float32(monkeypatch, weights, products_a_layer,
                                                                           qkv_products):
    model = load_model(FP32_FIXTURE, weights=weights)
    prompt = [(i * 37) % 500 + 3 for i in range(48)]  # one 48-row chunk: more rows than a decode step's 32
    reference = model.prefill(model.new_cache(), prompt)  # [vocab]
    rows = []
    real = _kernels.tile_multiply
    monkeypatch.setattr(_kernels, "tile_multiply", lambda packed, m, *rest: rows.append(m) or real(packed, m, *rest))
    tiled = load_model(FP32_FIXTURE, weights=weights, prefill_precision="bf16")  # its own; model keeps fp32
    cache = tiled.new_cache()
    logits = tiled.prefill(cache, prompt)  # [vocab]
    products = len(rows)
    # Every layer's products on the chunk's 48 rows, but the last layer's past its queries, keys and values: its
    # output is wanted for the last row alone, a float32 row (forward's trimmed last layer)
    assert products == products_a_layer * (model.config.num_hidden_layers - 1) + qkv_products
    assert set(rows) == {48}
    np.testing.assert_allclose(logits, reference, rtol=0, atol=0.05 * np.abs(reference).max())
    assert not np.array_equal(logits, reference)  # bf16 arithmetic did run
    tiled.step(cache, [int(np.argmax(logits))])  # a decode step: 1 row, float32
    tiled.step(cache, list(range(3, 35)))  # 32 rows, a speculative verify's most: float32 too
    assert len(rows) == products
    assert np.array_equal(model.prefill(model.new_cache(), prompt), reference)  # the first model: float32 still
    assert len(rows) == products


def test_asking_for_the_tiles_first_leaves_the_compiled_products_available():
    """A process that sets bf16 prefill before loading (the CLI does) still gets the compiled products and rope."""
    import subprocess
    import sys

    script = ("from kestrel_trio import _kernels; reason = _kernels.enable_tiles(); "
              "print(_kernels.ready(), _kernels.unavailable_reason() or '-')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=allowance(120))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "True", done.stdout
