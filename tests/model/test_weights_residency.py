"""weights="bf16": matrices stay bf16 bits (mapped from the file) and give fp32 mode's exact logits."""

from __future__ import annotations

import json
import logging
import mmap
from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import load_model
from kestrel_trio._model.decoder import layers
from kestrel_trio._model.products import matmul
from kestrel_trio._model.checkpoints.random_init import write_random_checkpoint
from kestrel_trio._model.checkpoints.safetensors import bf16_to_fp32, fp32_to_bf16_bits
from kestrel_trio._model.weights.residency import residency_bytes, resolve_residency
from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint
from kestrel_trio._model.weights.assemble import Bf16Matrix
from kestrel_trio.errors import ModelLoadError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEXT_ARCHITECTURES = {"Qwen3ForCausalLM", "Qwen2ForCausalLM", "Qwen3MoeForCausalLM"}


def _fixtures(storage: str) -> list[str]:
    names = []
    for folder in sorted(FIXTURES.iterdir()):
        meta_path = folder / "meta.json"
        if (folder / "golden.npz").exists() and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            if meta["storage_dtype"] == storage and meta["architecture"] in TEXT_ARCHITECTURES:
                names.append(folder.name)
    return names


BF16_FIXTURES = _fixtures("bfloat16")


def test_there_are_bf16_fixtures_of_each_text_family():
    assert {"qwen3_bf16_tied", "qwen3_bf16_sharded", "qwen3_moe"} <= set(BF16_FIXTURES)


@pytest.mark.parametrize("name", BF16_FIXTURES)
def test_bf16_mode_holds_fp32_modes_weights_exactly_and_gives_its_logits(name):
    """The upcast is exact; the products sum in another order (compiled row products, not BLAS), so the logits
    agree to float32 rounding rather than bit for bit, and greedy decoding is the same."""
    golden = np.load(FIXTURES / name / "golden.npz")
    ids = golden["input_ids"].tolist()
    fp32 = load_model(FIXTURES / name, weights="fp32")
    bf16 = load_model(FIXTURES / name, weights="bf16")
    assert (fp32.weights_mode, bf16.weights_mode) == ("fp32", "bf16")
    packed = bf16.decoder.weights.layers[0].attn.o_proj
    assert isinstance(packed, Bf16Matrix)
    np.testing.assert_array_equal(packed.dense(), fp32.decoder.weights.layers[0].attn.o_proj)
    want = fp32.logits(ids)
    np.testing.assert_allclose(bf16.logits(ids), want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    assert bf16.greedy(golden["prompt_ids"].tolist(), 32) == golden["greedy_ids"].tolist()


def test_bf16_matrices_are_memory_mapped_not_copied():
    model = load_model(FIXTURES / "qwen3_bf16_tied", weights="bf16")
    weights = model.decoder.weights
    matrices = [weights.embed_tokens, weights.layers[0].attn.qkv_proj, weights.layers[0].mlp.down_proj]
    for matrix in matrices:
        for part in (p.data for p in matrix.parts):
            assert part.dtype == np.uint16 and not part.flags.owndata and not part.flags.writeable
            base = part
            while isinstance(base, np.ndarray):
                base = base.base
            assert isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)
    assert weights.lm_head is weights.embed_tokens


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_chunks_that_cross_parts_compute_the_same_product(monkeypatch, rows):
    rng = np.random.default_rng(rows)
    parts = [fp32_to_bf16_bits(rng.standard_normal((n, 8), dtype=np.float32)).reshape(n, 8) for n in (5, 3, 7)]
    dense = np.concatenate([bf16_to_fp32(p.reshape(-1)).reshape(p.shape) for p in parts])  # [15, 8]
    x = rng.standard_normal((rows, 8), dtype=np.float32)  # [rows, 8]
    monkeypatch.setattr(matmul, "UPCAST_CHUNK", 4 * 8)  # 4 rows a chunk: chunks straddle the parts
    got = layers.linear(x, Bf16Matrix(tuple(parts)))
    assert got.shape == (rows, 15)
    np.testing.assert_allclose(got, x.astype(np.float64) @ dense.T.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_embedding_rows_are_the_exact_upcast():
    bits = fp32_to_bf16_bits(np.linspace(-3, 3, 40, dtype=np.float32)).reshape(10, 4)
    table = Bf16Matrix((bits,))
    ids = np.array([7, 0, 7])
    np.testing.assert_array_equal(layers.embedding(table, ids), bf16_to_fp32(bits.reshape(-1)).reshape(10, 4)[ids])


def test_an_fp32_checkpoint_in_bf16_mode_is_rounded_with_a_warning(tmp_path, caplog):
    config = {
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 24,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 10000.0,
    }
    write_random_checkpoint(tmp_path / "f32", config, seed=1, dtype="F32")
    write_random_checkpoint(tmp_path / "bf16", config, seed=1, dtype="BF16")
    with caplog.at_level(logging.WARNING):
        rounded = load_model(tmp_path / "f32", weights="bf16")
    assert "rounded to bf16" in caplog.text
    stored = load_model(tmp_path / "bf16", weights="fp32").decoder.weights.layers[0]
    matrix = rounded.decoder.weights.layers[0].mlp.gate_up_proj
    assert isinstance(matrix, Bf16Matrix) and len(matrix.parts) == 2
    identity = np.eye(16, dtype=np.float32)  # x @ W.T with x = I is W.T, exactly
    np.testing.assert_array_equal(layers.linear(identity, matrix).T, stored.mlp.gate_up_proj)


def test_auto_shrinks_the_weights_only_as_far_as_the_memory_needs():
    folder = FIXTURES / "qwen3_bf16_tied"
    sizes = residency_bytes(info.shape for info in SafetensorsCheckpoint(folder).tensors.values())
    assert sizes["fp32"] > sizes["bf16"] > sizes["int8"] > sizes["int4"]
    assert resolve_residency(folder, "auto", available_bytes=10**12) == "fp32"
    for form in ("fp32", "bf16", "int8", "int4"):  # just enough memory for each form: that form
        assert resolve_residency(folder, "auto", available_bytes=int(sizes[form] / 0.7) + 1) == form
    assert resolve_residency(folder, "auto", available_bytes=1000) == "int4"  # nothing fits: the smallest
    assert resolve_residency(folder, "bf16", available_bytes=10**12) == "bf16"
    with pytest.raises(ModelLoadError, match="weights"):
        resolve_residency(folder, "fp8")
    with pytest.raises(ModelLoadError, match="GGUF"):
        resolve_residency(folder, "gguf")


def test_bf16_products_shared_among_threads_equal_the_single_thread_ones() -> None:
    from kestrel_trio._model.products.matmul import UPCAST_CHUNK, linear_bf16, set_product_threads
    from kestrel_trio._model.checkpoints.safetensors import fp32_to_bf16_bits
    from kestrel_trio._model.weights.assemble import Bf16Matrix

    rng = np.random.default_rng(3)
    width = 256
    rows = 5 * (UPCAST_CHUNK // width) + 17  # several chunks and a partial one, over two parts
    bits = fp32_to_bf16_bits(rng.standard_normal((rows, width)).astype(np.float32))  # [rows, width]
    matrix = Bf16Matrix((bits[:1000], bits[1000:]))
    exact = (bits.astype(np.uint32) << 16).view(np.float32)  # [rows, width]
    for n in (1, 5):
        x = rng.standard_normal((n, width)).astype(np.float32)  # [n, width]
        try:
            set_product_threads(1)
            alone = linear_bf16(x, matrix)  # [n, rows]
            set_product_threads(3)
            shared = linear_bf16(x, matrix)  # [n, rows]
        finally:
            set_product_threads(1)
        assert np.array_equal(alone, shared)
        np.testing.assert_allclose(shared, x @ exact.T, rtol=1e-5, atol=1e-4)
