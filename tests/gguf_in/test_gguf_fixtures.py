"""The tiny GGUF fixtures (every tensor type, four architectures) load and equal transformers' goldens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from kestrel_trio import load_model  # noqa: E402
from kestrel_trio._model.weights.gguf_checkpoint import GgufCheckpoint  # noqa: E402
from kestrel_trio._model.gguf.config import config_from_gguf, gguf_architecture  # noqa: E402
from kestrel_trio._model.gguf.reader import GgufFile  # noqa: E402

GGUF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
NAMES = sorted(p.name for p in GGUF_FIXTURES.iterdir() if (p / "golden.npz").exists())
ALL_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}


def _file(name: str) -> Path:
    return GGUF_FIXTURES / name / f"{name}.gguf"


def test_the_fixtures_cover_every_architecture_and_tensor_type():
    metas = [json.loads((GGUF_FIXTURES / n / "meta.json").read_text()) for n in NAMES]
    assert {m["gguf_architecture"] for m in metas} == {"llama", "qwen2", "qwen3", "qwen3moe"}
    assert set().union(*(m["tensor_types"].values() for m in metas)) == ALL_TYPES
    # What the file says is what gguf's own reader sees.
    for name, meta in zip(NAMES, metas):
        reader = gguf.GGUFReader(_file(name))
        assert {t.name: t.tensor_type.name for t in reader.tensors} == meta["tensor_types"]


@pytest.fixture(scope="module", params=NAMES)
def loaded(request):
    return load_model(_file(request.param)), np.load(GGUF_FIXTURES / request.param / "golden.npz")


def test_logits_equal_transformers_within_1e_4_relative(loaded):
    model, golden = loaded
    logits = model.logits(golden["input_ids"].tolist())
    assert logits.shape == golden["logits"].shape
    tolerance = 1e-4 * max(1.0, float(np.abs(golden["logits"]).max()))
    assert float(np.abs(logits - golden["logits"]).max()) <= tolerance


def test_greedy_equals_transformers(loaded):
    model, golden = loaded
    assert model.greedy(golden["prompt_ids"].tolist(), 32) == golden["greedy_ids"].tolist()


def test_cached_decode_equals_the_full_forward(loaded):
    model, golden = loaded
    ids = golden["input_ids"].tolist()
    full = model.logits(ids)
    cache = model.new_cache()
    rows = [model.step(cache, ids[:5], all_logits=True)] + [model.step(cache, [t], all_logits=True) for t in ids[5:]]
    assert float(np.abs(np.concatenate(rows) - full).max()) <= 1e-5 * max(1.0, float(np.abs(full).max()))


def _reference_rows(reader_tensor, arch: str, config, name: str) -> np.ndarray:
    """gguf's dequantization of a file tensor, in transformers' layout (llama q/k permutation undone)."""
    values = np.asarray(gguf.quants.dequantize(reader_tensor.data, reader_tensor.tensor_type), dtype=np.float32)
    if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
        heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
        shape = values.shape
        values = values.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    return values


@pytest.mark.parametrize("name", NAMES)
def test_every_expanded_tensor_equals_gguf_dequantize_bit_for_bit(name):
    gguf_file = GgufFile(_file(name))
    arch = gguf_architecture(gguf_file)
    config = config_from_gguf(gguf_file)
    checkpoint = GgufCheckpoint(gguf_file, config, arch)
    by_file_name: dict[str, list[str]] = {}
    for ref in checkpoint.tensors.values():
        by_file_name.setdefault(ref.gguf_name, []).append(ref.name)
    reader = gguf.GGUFReader(_file(name))
    seen = 0
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":
            continue
        expected = _reference_rows(tensor, arch, config, tensor.name)  # [..., cols]
        for hf_name in by_file_name[tensor.name]:
            ref = checkpoint.tensors[hf_name]
            want = expected[ref.expert] if ref.expert is not None else expected.reshape(ref.shape)
            got = checkpoint.read(hf_name)
            assert got.shape == want.shape, hf_name
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), hf_name
            seen += 1
    assert seen == len(checkpoint.tensors)


def test_llama3_rope_scaling_comes_from_rope_freqs():
    config = config_from_gguf(GgufFile(_file("llama_quant")))
    factors = np.asarray(config.rope.freq_factors)
    assert factors.shape == (config.head_dim // 2,) and factors.max() == 8.0 and factors.min() == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_bf16_residency_loads_a_gguf(name):
    golden = np.load(GGUF_FIXTURES / name / "golden.npz")
    model = load_model(_file(name), weights="bf16")
    assert model.weights_mode == "bf16"
    logits = model.logits(golden["input_ids"].tolist())
    assert float(np.abs(logits - golden["logits"]).max()) <= 0.1 * max(1.0, float(np.abs(golden["logits"]).max()))


def test_the_model_is_named_after_the_file():
    assert load_model(_file("qwen2_quant")).name == "qwen2_quant"
