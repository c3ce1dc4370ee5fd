"""weights="int8" / "int4": a float checkpoint quantized at load, cached on disk, mapped on the next load.

Three kinds of check:

* weights already on the quantization grid (int8: q * scale per row, some
  |q| = 127 in each; int4: q * fp16 scale per group of 64, some |q| = 7 in
  each) are quantized without loss, so the logits must equal fp32 mode's to
  float rounding (1e-4 relative) and greedy decoding must match: any slip in
  packing, nibble order, scales, the cache or the products fails this;
* on the ordinary random fixtures, int8 logits stay within INT8_TOLERANCE
  (relative to the largest logit) of fp32 mode, and greedy picks equal fp32's
  at every position whose fp32 margin exceeds twice that tolerance. Random
  tiny models are chaotic (no structure damps an error), so this is loose;
* the quality of each scheme on one product of trained-size weights.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import load_model
from kestrel_trio._model.decoder import layers
from kestrel_trio._model.forms.packed import Int4Rows, Int8Rows, PackedMatrix
from kestrel_trio._model.weights.quantize import quantize_int4, quantize_int8, rows_from_arrays
from kestrel_trio._model.checkpoints.random_init import write_random_checkpoint
from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint, save_safetensors
from kestrel_trio._model.weights.assemble import Bf16Matrix

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEXT_FIXTURES = ["qwen3_fp32", "qwen3_bf16_tied", "qwen3_bf16_sharded", "qwen2_fp32", "llama_fp32", "qwen3_moe"]
INT8_TOLERANCE = 0.2  # of max |logit|; measured 0.04-0.14 on these fixtures (the MoE one flips a route)
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 96, "hidden_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 192,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0,
}
IDS = [3, 17, 5, 90, 41, 41, 8, 64, 2, 33]


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max()) / float(np.abs(b).max())


def _on_grid(tensors: dict[str, np.ndarray], form: str, seed: int) -> dict[str, np.ndarray]:
    """``tensors`` with every matrix replaced by one exactly representable in ``form``."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, array in tensors.items():
        if array.ndim < 2:
            out[name] = array
            continue
        rows, cols = array.shape
        if form == "int8":
            q = rng.integers(-127, 128, size=(rows, cols))
            q[np.arange(rows), rng.integers(0, cols, rows)] = 127 * rng.choice([-1, 1], rows)  # |q| = 127 in each row
            scale = rng.uniform(2e-4, 4e-4, size=(rows, 1)).astype(np.float32)
        else:
            groups = cols // 64
            q = rng.integers(-7, 8, size=(rows, groups, 64))
            q[:, :, 0] = 7 * rng.choice([-1, 1], (rows, groups))  # |q| = 7 in each group
            scale = rng.uniform(3e-3, 6e-3, size=(rows, groups, 1)).astype(np.float16).astype(np.float32)
        out[name] = (q * scale).astype(np.float32).reshape(rows, cols)
    return out


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_weights_on_the_grid_give_fp32_modes_logits(tmp_path, form):
    tensors = write_random_checkpoint(tmp_path / "random", CONFIG, seed=4, dtype="F32")
    folder = tmp_path / "grid"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    save_safetensors(folder / "model.safetensors", _on_grid(tensors, form, seed=5), "F32")
    fp32 = load_model(folder, weights="fp32")
    quantized = load_model(folder, weights=form, quantized_cache=tmp_path / "cache")
    assert quantized.weights_mode == form
    rows = quantized.decoder.weights.layers[0].mlp.gate_up_proj.parts
    assert all(isinstance(p, Int8Rows if form == "int8" else Int4Rows) for p in rows)
    np.testing.assert_allclose(quantized.decoder.weights.layers[1].attn.qkv_proj.dense(),
                               fp32.decoder.weights.layers[1].attn.qkv_proj, rtol=1e-6, atol=0)
    assert _relative(quantized.logits(IDS), fp32.logits(IDS)) <= 1e-4
    assert quantized.greedy(IDS[:4], 24) == fp32.greedy(IDS[:4], 24)


@pytest.mark.parametrize("name", TEXT_FIXTURES)
def test_int8_logits_stay_near_fp32_and_greedy_agrees_where_margins_allow(tmp_path, name):
    golden = np.load(FIXTURES / name / "golden.npz")
    ids = golden["input_ids"].tolist()
    fp32 = load_model(FIXTURES / name, weights="fp32").logits(ids)  # [T, vocab]
    int8 = load_model(FIXTURES / name, weights="int8", quantized_cache=False).logits(ids)  # [T, vocab]
    tolerance = INT8_TOLERANCE * float(np.abs(fp32).max())
    assert float(np.abs(int8 - fp32).max()) <= tolerance
    top = np.sort(fp32, axis=-1)
    clear = top[:, -1] - top[:, -2] > 2 * tolerance  # [T] positions whose pick the error cannot flip
    assert np.array_equal(int8.argmax(-1)[clear], fp32.argmax(-1)[clear])


def test_int4_of_random_fixtures_runs_every_family(tmp_path):
    for name in TEXT_FIXTURES:
        model = load_model(FIXTURES / name, weights="int4", quantized_cache=False)
        logits = model.logits(np.load(FIXTURES / name / "golden.npz")["input_ids"].tolist())
        assert np.isfinite(logits).all() and model.weights_mode == "int4"


@pytest.mark.parametrize(("form", "bound"), [("int8", 0.01), ("int4", 0.12)])
def test_quality_of_one_product_of_trained_size_weights(form, bound):
    """Relative RMS error of x @ W.T for Gaussian weights (std 0.02) [768, 1024]: the scheme's own cost.

    Expected: int8 ~0.6% (a step of max|row| / 127), int4 ~10% (max|group| / 7).
    """
    rng = np.random.default_rng(9)
    weights = (rng.standard_normal((768, 1024)) * 0.02).astype(np.float32)  # [768, 1024]
    arrays = quantize_int8(weights) if form == "int8" else quantize_int4(weights, 64)
    matrix = PackedMatrix((rows_from_arrays(form, arrays),))
    for n in (1, 8, 40):  # scales on partial sums, and on expanded chunks
        x = rng.standard_normal((n, 1024)).astype(np.float32)  # [n, 1024]
        exact = x @ weights.T  # [n, 768]
        got = layers.linear(x, matrix)  # [n, 768]
        error = np.sqrt(np.mean((got - exact) ** 2) / np.mean(exact**2))
        assert error <= bound
        np.testing.assert_allclose(got, x @ matrix.dense().T, rtol=1e-4, atol=1e-4 * np.abs(exact).max())


def _cache_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.kq")) if directory.exists() else []


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_the_second_load_maps_the_cache_and_gives_identical_logits(tmp_path, form, caplog):
    cache = tmp_path / "cache"
    golden = np.load(FIXTURES / "qwen3_bf16_tied" / "golden.npz")
    ids = golden["input_ids"].tolist()
    with caplog.at_level(logging.INFO):
        first = load_model(FIXTURES / "qwen3_bf16_tied", weights=form, quantized_cache=cache)
    assert "wrote the quantized cache" in caplog.text
    (written,) = _cache_files(cache)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        second = load_model(FIXTURES / "qwen3_bf16_tied", weights=form, quantized_cache=cache)
    assert "mapped from the quantized cache" in caplog.text and "quantizing" not in caplog.text
    assert _cache_files(cache) == [written]
    np.testing.assert_array_equal(second.logits(ids), first.logits(ids))
    for matrix in (second.decoder.weights.embed_tokens, second.decoder.weights.layers[0].attn.qkv_proj):
        for part in matrix.parts:
            for array in (part.data, part.scale):
                base = array
                while isinstance(base, np.ndarray):
                    base = base.base
                assert isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)
                assert not array.flags.writeable
    assert second.decoder.weights.lm_head is second.decoder.weights.embed_tokens  # tied: one matrix


def test_a_changed_checkpoint_gets_a_new_cache_and_a_broken_one_is_rebuilt(tmp_path, caplog):
    folder, cache = tmp_path / "model", tmp_path / "cache"
    write_random_checkpoint(folder, CONFIG, seed=1, dtype="BF16", std=0.02)
    first = load_model(folder, weights="int8", quantized_cache=cache).logits(IDS)
    (old,) = _cache_files(cache)
    write_random_checkpoint(folder, CONFIG, seed=2, dtype="BF16", std=0.02)  # other weights, same place
    stat = (folder / "model.safetensors").stat()
    os.utime(folder / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    changed = load_model(folder, weights="int8", quantized_cache=cache).logits(IDS)
    assert len(_cache_files(cache)) == 2 and not np.array_equal(changed, first)
    (new,) = [p for p in _cache_files(cache) if p != old]
    new.write_bytes(new.read_bytes()[: new.stat().st_size // 2])  # a torn file
    with caplog.at_level(logging.WARNING):
        rebuilt = load_model(folder, weights="int8", quantized_cache=cache).logits(IDS)
    assert "unusable quantized cache file" in caplog.text
    np.testing.assert_array_equal(rebuilt, changed)


def test_no_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    load_model(FIXTURES / "qwen3_bf16_tied", weights="int4", quantized_cache=False)
    assert not (tmp_path / "xdg").exists()
    load_model(FIXTURES / "qwen3_bf16_tied", weights="int4")  # the default: $XDG_CACHE_HOME/kestrel-trio/quantized
    assert len(_cache_files(tmp_path / "xdg" / "kestrel-trio" / "quantized")) == 1


def test_the_fused_expert_layout_quantizes_expert_by_expert(tmp_path):
    from test_moe_fused_layout import fused_copy

    fused_copy(tmp_path / "fused")
    ids = np.load(FIXTURES / "qwen3_moe" / "golden.npz")["input_ids"].tolist()
    fused = load_model(tmp_path / "fused", weights="int8", quantized_cache=False)
    per_expert = load_model(FIXTURES / "qwen3_moe", weights="int8", quantized_cache=False)
    np.testing.assert_allclose(fused.logits(ids), per_expert.logits(ids), rtol=1e-5, atol=1e-5)
    expert = fused.decoder.weights.layers[0].mlp.experts[1]
    assert np.shares_memory(expert.gate_proj.parts[0].data, expert.gate_up_proj.parts[0].data)  # views


def test_the_matrices_are_quantized_and_the_vectors_float32():
    model = load_model(FIXTURES / "qwen3_fp32", weights="int8", quantized_cache=False)
    w = model.decoder.weights
    assert all(isinstance(m, PackedMatrix) and not isinstance(m, Bf16Matrix)
               for m in (w.embed_tokens, w.lm_head, w.layers[0].attn.o_proj, w.layers[0].mlp.down_proj))
    assert w.norm.dtype == np.float32 and w.layers[0].attn.q_norm.dtype == np.float32
    stored = sum(i.nbytes for i in SafetensorsCheckpoint(FIXTURES / "qwen3_fp32").tensors.values())
    held = sum(p.nbytes for m in (w.embed_tokens, w.lm_head) for p in m.parts)
    assert held < stored / 3  # one byte a weight, from four


def test_a_form_that_does_not_apply_is_refused_before_loading():
    from kestrel_trio.errors import ModelLoadError
    from kestrel_trio.model import check_model_folder

    gguf_file = FIXTURES / "gguf" / "qwen3_quant" / "qwen3_quant.gguf"
    with pytest.raises(ModelLoadError, match="weights=gguf"):
        check_model_folder(gguf_file, weights="int4")
    with pytest.raises(ModelLoadError, match="int8 or int4"):
        check_model_folder(FIXTURES / "qwen3_bf16_tied", weights="gguf")
    check_model_folder(gguf_file, weights="gguf")
    check_model_folder(FIXTURES / "qwen3_bf16_tied", weights="int8")
    check_model_folder(FIXTURES / "qwen3_bf16_tied", weights="auto")


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_shared_products_equal_the_single_thread_ones(form):
    """Several chunks over two parts; int8's column scales applied once per stretch, per thread."""
    from kestrel_trio._model.products import matmul

    rng = np.random.default_rng(11)
    first, second = ((rng.standard_normal((n, 512)) * 0.02).astype(np.float32) for n in (700, 333))
    quantize = quantize_int8 if form == "int8" else (lambda w: quantize_int4(w, 64))
    matrix = PackedMatrix((rows_from_arrays(form, quantize(first)), rows_from_arrays(form, quantize(second))))
    dense = matrix.dense()  # [1033, 512]
    for n in (1, 5, 12):
        x = rng.standard_normal((n, 512)).astype(np.float32)  # [n, 512]
        try:
            matmul.set_product_threads(1)
            alone = matmul.linear_packed(x, matrix)  # [n, 1033]
            matmul.set_product_threads(3)
            shared = matmul.linear_packed(x, matrix)  # [n, 1033]
        finally:
            matmul.set_product_threads(1)
        assert np.array_equal(alone, shared)
        np.testing.assert_allclose(shared, x @ dense.T, rtol=1e-4, atol=1e-5)
