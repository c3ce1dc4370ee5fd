"""A prefill chunk held packed through its layers (kestrel_trio._kernels.x86.float32.packed_rows and
kestrel_trio._model.decoder.packed_layers): the packed products, norm and layout against float64 and numpy, the forward
pass's logits and cache against the layers over rows, which chunks take it, and the way back to rows where a
layer's one q/k/v pass cannot run."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import _kernels, load_model
from kestrel_trio._kernels.wrappers import prefill
from kestrel_trio._model.decoder.layers import rms_norm, swiglu

from kernel_plan_kit import enable_chunk_kernel, runnable

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
_RUNNABLE = "avx512" in runnable("chunk_products")  # chosen here, or executed and played as chosen
pytestmark = [pytest.mark.host_cpu,
              pytest.mark.skipif(not _RUNNABLE, reason="the chunk kernel does not run here: "
                                 f"{_kernels.unavailable_reason() or prefill._chunks_unusable()}")]
# the package's ``forward`` is the function
forward_module = importlib.import_module("kestrel_trio._model.decoder.forward")
if _RUNNABLE:
    from kestrel_trio._kernels.x86.float32 import chunks as f32_chunks, packed_rows


@pytest.fixture(autouse=True)
def _enabled(monkeypatch):
    enable_chunk_kernel(monkeypatch)


def _serially(tasks):
    for task in tasks:
        task()


def _split(parts: int):
    return lambda items: [(items * p // parts, items * (p + 1) // parts) for p in range(parts)]


def test_a_block_is_the_chunk_kernels_block_of_activation_rows():
    assert packed_rows.LANES == f32_chunks.ACTIVATION_ROWS


def test_pack_then_unpack_gives_the_rows_back_with_zeros_after_them():
    x = np.random.default_rng(0).standard_normal((70, 12), dtype=np.float32)  # [T, K]
    packed = packed_rows.pack(x, 3)  # [3, K, 32]
    assert packed.shape == (3, 12, 32)
    np.testing.assert_array_equal(packed_rows.unpack(packed, 70), x)
    assert not packed_rows.unpack(packed, 96)[70:].any()


@pytest.mark.parametrize("m, n, k", [(64, 28, 64), (96, 4096 // 64, 1028), (70, 33, 2056), (32, 14, 8)])
@pytest.mark.parametrize("shares", [1, 2, 3])
def test_the_products_agree_with_float64_in_every_layout(m, n, k, shares):
    rng = np.random.default_rng(m + n + k + shares)
    x = rng.standard_normal((m, k), dtype=np.float32)  # [M, K]
    w = rng.standard_normal((n, k), dtype=np.float32)  # [N, K]: rows past whole blocks of 14 when N % 14
    blocks = -(-m // 32)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)  # [M, N]
    limit = 2e-6 * np.abs(exact).max()
    packed = packed_rows.pack(x, blocks)  # [B, K, 32]
    for out in (packed_rows.product(packed, w, _serially, _split(shares)),
                packed_rows.product_of_rows(x, blocks, w, _serially, _split(shares))):
        assert out.shape == (blocks, n, 32)
        np.testing.assert_allclose(packed_rows.unpack(out, m), exact, rtol=0, atol=limit)
        assert not packed_rows.unpack(out, blocks * 32)[m:].any()  # zero tokens give zero sums
    rows = packed_rows.product_rows(packed, w, _serially, _split(shares))  # [B*32, N]
    assert rows.shape == (blocks * 32, n)
    np.testing.assert_allclose(rows[:m], exact, rtol=0, atol=limit)


@pytest.mark.parametrize("shares", [1, 2, 3])
def test_the_epilogue_runs_once_on_each_shares_blocks_after_their_product(shares):
    rng = np.random.default_rng(shares)
    packed = packed_rows.pack(rng.standard_normal((150, 16), dtype=np.float32), 5)  # [5, K, 32]
    w = rng.standard_normal((30, 16), dtype=np.float32)  # [N, K]
    seen = []

    def then(out, first, stop):  # the share's blocks are written when it runs
        seen.append((first, stop, out[first:stop].copy()))
    out = packed_rows.product(packed, w, _serially, _split(shares), then)  # [5, N, 32]
    assert sorted((first, stop) for first, stop, _ in seen) == _split(shares)(5)
    for first, stop, part in seen:
        np.testing.assert_array_equal(part, out[first:stop])


def test_the_packed_swiglu_is_the_rows_swiglu_token_by_token():
    rng = np.random.default_rng(2)
    gate, up = rng.standard_normal((2, 64, 24), dtype=np.float32) * 3  # [T, inter] each
    gate_up = np.concatenate([packed_rows.pack(gate, 2), packed_rows.pack(up, 2)], axis=1)  # [2, 2*inter, 32]
    act = np.full((2, 24, 32), np.nan, dtype=np.float32)  # [2, inter, 32]
    packed_rows.swiglu(gate_up, act, 0, 1)
    packed_rows.swiglu(gate_up, act, 1, 2)
    np.testing.assert_array_equal(packed_rows.unpack(act, 64), swiglu(np.concatenate([gate, up], axis=1)))


def test_the_packed_norm_is_the_rows_norm_token_by_token():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((80, 96), dtype=np.float32) * 4  # [T, hidden]
    weight = rng.random(96, dtype=np.float32) + 0.5  # [hidden]
    got = packed_rows.unpack(packed_rows.rms_norm(packed_rows.pack(x, 3), weight, 1e-6), 80)  # [T, hidden]
    want = rms_norm(x, weight, 1e-6)  # [T, hidden]
    np.testing.assert_allclose(got, want, rtol=8 * np.finfo(np.float32).eps, atol=0)


def _rows_only(monkeypatch):
    monkeypatch.setattr(forward_module, "takes_packed", lambda *args: False)


def _spy_on_packed(monkeypatch) -> list:
    real, runs = forward_module.packed_layers, []

    def spy(*args):
        result = real(*args)
        runs.append(result[1])  # the layer it stopped before
        return result
    monkeypatch.setattr(forward_module, "packed_layers", spy)
    return runs


# qwen3: q/k head norms, head_dim 32 (the chunk attention's kernel); qwen2: q/k/v biases; llama: o_proj's and the
# MLP's biases too, head_dim 16 (numpy's attention).
@pytest.mark.parametrize("name", ["qwen3_fp32", "qwen2_fp32", "llama_fp32"])
def test_a_chunk_of_one_sequence_goes_packed_and_agrees_with_the_rows(monkeypatch, name):
    model = load_model(FIXTURES / name, weights="fp32")
    layers = model.config.num_hidden_layers
    ids = np.arange(3, 3 + 128, dtype=np.int64) % model.config.vocab_size  # [T]
    runs = _spy_on_packed(monkeypatch)
    packed_cache = model.new_cache()
    packed = model.prefill(packed_cache, ids, chunk=64)  # [vocab]: two chunks of 64
    assert runs == [layers - 1, layers - 1]  # each chunk's last layer in rows (none of the first's rows wanted)
    _rows_only(monkeypatch)
    rows_cache = model.new_cache()
    rows = model.prefill(rows_cache, ids, chunk=64)  # [vocab]
    np.testing.assert_allclose(packed, rows, rtol=0, atol=2e-5 * max(1.0, float(np.abs(rows).max())))
    for layer in range(layers):
        for got, want in zip(packed_cache.stored(layer, 0), rows_cache.stored(layer, 0)):  # [n_kv, 128, hd] each
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, float(np.abs(want).max())))


def test_every_rows_logits_come_out_of_the_packed_layers(monkeypatch):
    model = load_model(FIXTURES / "qwen3_fp32", weights="fp32")
    ids = np.arange(5, 5 + 64, dtype=np.int64)  # [T]
    runs = _spy_on_packed(monkeypatch)
    packed = model.step(model.new_cache(), ids, all_logits=True)  # [T, vocab]
    assert runs == [model.config.num_hidden_layers]
    _rows_only(monkeypatch)
    rows = model.step(model.new_cache(), ids, all_logits=True)  # [T, vocab]
    np.testing.assert_allclose(packed, rows, rtol=0, atol=2e-5 * max(1.0, float(np.abs(rows).max())))


@pytest.mark.parametrize("tokens, taken", [(64, True), (61, True), (60, False), (40, False), (32, False), (96, True)])
def test_a_chunk_is_packed_only_where_padding_adds_at_most_a_sixteenth(monkeypatch, tokens, taken):
    model = load_model(FIXTURES / "qwen3_fp32", weights="fp32")
    runs = _spy_on_packed(monkeypatch)
    model.prefill(model.new_cache(), np.arange(3, 3 + tokens, dtype=np.int64), chunk=tokens)
    assert bool(runs) == taken


@pytest.mark.parametrize("name, weights, kv", [("qwen3_fp32", "fp32", "bf16"), ("qwen3_bf16_tied", "bf16", "fp32"),
                                               ("qwen3_moe", "fp32", "fp32")])
def test_bf16_caches_bf16_weights_and_experts_stay_in_rows(monkeypatch, name, weights, kv):
    model = load_model(FIXTURES / name, weights=weights)
    runs = _spy_on_packed(monkeypatch)
    model.prefill(model.new_cache(kv), np.arange(3, 67, dtype=np.int64), chunk=64)
    assert runs == []


def test_two_sequences_in_one_pass_stay_in_rows(monkeypatch):
    model = load_model(FIXTURES / "qwen3_fp32", weights="fp32")
    runs = _spy_on_packed(monkeypatch)
    caches = [model.new_cache(), model.new_cache()]
    ids = np.arange(3, 131, dtype=np.int64)  # [2 x 64]
    positions = np.concatenate([np.arange(64), np.arange(64)])  # [128]
    forward_module.forward(model.decoder, ids, positions, caches, [64, 64])
    assert runs == []


def test_a_layer_whose_one_pass_cannot_run_goes_on_in_rows_from_there(monkeypatch):
    model = load_model(FIXTURES / "qwen3_fp32", weights="fp32")
    ids = np.arange(7, 7 + 64, dtype=np.int64)  # [T]
    packed_layers = importlib.import_module("kestrel_trio._model.decoder.packed_layers")
    real = packed_layers.chunk_attention
    monkeypatch.setattr(packed_layers, "chunk_attention",
                        lambda c, a, index, *rest: None if index == 1 else real(c, a, index, *rest))
    runs = _spy_on_packed(monkeypatch)
    mixed = model.prefill(model.new_cache(), ids, chunk=64)  # [vocab]
    assert runs == [1]
    _rows_only(monkeypatch)
    rows = model.prefill(model.new_cache(), ids, chunk=64)  # [vocab]
    np.testing.assert_allclose(mixed, rows, rtol=0, atol=2e-5 * max(1.0, float(np.abs(rows).max())))
