"""The decode-speed layouts (fused projections, direct reads, small-batch calls) change no result."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest

from kestrel_trio import load_model
from kestrel_trio._model import forward
from kestrel_trio._model.layers import linear, set_small_batch_call, small_batch_call
from kestrel_trio._model.random_init import write_random_checkpoint
from kestrel_trio._model.safetensors import SafetensorsCheckpoint
from kestrel_trio._model.weights import Attention, DenseMLP, SparseMoE
from kestrel_trio.errors import ModelLoadError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = {
    "architectures": ["Qwen2ForCausalLM"], "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 24,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0,
}


def _unfused(decoder):
    """The same decoder with every fused matrix replaced by separate copies (the pre-fusion layout)."""

    def attn(a: Attention) -> Attention:
        copy = lambda m: None if m is None else m.copy()  # noqa: E731
        return attrs.evolve(a, q_proj=a.q_proj.copy(), k_proj=a.k_proj.copy(), v_proj=a.v_proj.copy(),
                            q_bias=copy(a.q_bias), k_bias=copy(a.k_bias), v_bias=copy(a.v_bias),
                            qkv_proj=None, qkv_bias=None)

    def mlp(m):
        if isinstance(m, SparseMoE):
            return attrs.evolve(m, experts=tuple(mlp(e) for e in m.experts))
        return DenseMLP(gate_proj=m.gate_proj.copy(), up_proj=m.up_proj.copy(), down_proj=m.down_proj)

    layers = tuple(attrs.evolve(layer, attn=attn(layer.attn), mlp=mlp(layer.mlp)) for layer in decoder.weights.layers)
    return attrs.evolve(decoder, weights=attrs.evolve(decoder.weights, layers=layers))


@pytest.mark.parametrize("name", ["qwen2_fp32", "qwen3_bf16_tied", "qwen3_moe"])
def test_fused_projections_equal_separate_ones(name):
    model = load_model(FIXTURES / name)
    ids = np.arange(3, 14, dtype=np.int64)  # [T]
    positions = np.arange(ids.size, dtype=np.int64)  # [T]
    fused = forward(model.decoder, ids, positions, [model.new_cache()], [ids.size], all_logits=True)
    separate = forward(_unfused(model.decoder), ids, positions, [model.new_cache()], [ids.size], all_logits=True)
    assert fused.shape == (ids.size, model.config.vocab_size)
    np.testing.assert_allclose(fused, separate, rtol=0, atol=1e-5 * max(1.0, float(np.abs(separate).max())))


def test_separate_names_are_views_of_the_fused_matrix_with_the_checkpoint_values(tmp_path):
    tensors = write_random_checkpoint(tmp_path, TINY, seed=3)
    attn = load_model(tmp_path).decoder.weights.layers[1].attn
    mlp = load_model(tmp_path).decoder.weights.layers[1].mlp
    p = "model.layers.1."
    for part in ("q", "k", "v"):
        assert np.shares_memory(getattr(attn, f"{part}_proj"), attn.qkv_proj)
        np.testing.assert_array_equal(getattr(attn, f"{part}_proj"), tensors[p + f"self_attn.{part}_proj.weight"])
        np.testing.assert_array_equal(getattr(attn, f"{part}_bias"), tensors[p + f"self_attn.{part}_proj.bias"])
    assert attn.qkv_proj.shape == (4 * 8 + 2 * 2 * 8, 16) and not attn.qkv_proj.flags.writeable
    assert np.shares_memory(mlp.up_proj, mlp.gate_up_proj)
    np.testing.assert_array_equal(mlp.up_proj, tensors[p + "mlp.up_proj.weight"])
    np.testing.assert_array_equal(mlp.gate_proj, tensors[p + "mlp.gate_proj.weight"])


@pytest.mark.parametrize("dtype", ["F32", "BF16", "F16"])
def test_read_into_equals_read(tmp_path, dtype):
    write_random_checkpoint(tmp_path, TINY, seed=4, dtype=dtype)
    checkpoint = SafetensorsCheckpoint(tmp_path)
    name = "model.layers.0.mlp.down_proj.weight"
    out = np.full((16, 24), np.nan, dtype=np.float32)
    checkpoint.read_into(name, out)
    np.testing.assert_array_equal(out, checkpoint.read(name))
    with pytest.raises(ValueError, match="destination"):
        checkpoint.read_into(name, np.empty((16, 23), dtype=np.float32))


@pytest.mark.parametrize("rows", [1, 2, 8, 32, 40])
def test_both_small_batch_calls_compute_the_same_product(rows):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 64), dtype=np.float32)  # [rows, in]
    w = rng.standard_normal((48, 64), dtype=np.float32)  # [out, in]
    bias = rng.standard_normal(48, dtype=np.float32)  # [out]
    expected = x.astype(np.float64) @ w.T.astype(np.float64) + bias  # [rows, out]
    try:
        for call in ("weight_left", "weight_right"):
            set_small_batch_call(call)
            y = linear(x, w, bias)
            assert y.shape == (rows, 48) and y.flags.c_contiguous
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)
    finally:
        set_small_batch_call(None)


def test_the_small_batch_call_is_timed_once_and_can_be_forced():
    set_small_batch_call(None)
    assert small_batch_call() in ("weight_left", "weight_right")
    set_small_batch_call("weight_right")
    assert small_batch_call() == "weight_right"
    with pytest.raises(ValueError):
        set_small_batch_call("sideways")
    set_small_batch_call(None)


def test_blas_threads_is_applied_process_wide_and_validated(tmp_path):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    write_random_checkpoint(tmp_path, TINY, seed=5)
    blas = lambda: [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]  # noqa: E731
    before = blas()
    try:
        load_model(tmp_path, blas_threads=1)
        assert blas() and set(blas()) == {1}
        with pytest.raises(ModelLoadError, match="blas_threads"):
            load_model(tmp_path, blas_threads=0)
    finally:
        threadpoolctl.threadpool_limits(limits=max(before), user_api="blas")
