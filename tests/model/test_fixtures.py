"""The numpy model equals transformers on every committed tiny checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "golden.npz").exists())


def test_every_architecture_and_storage_is_covered():
    metas = [json.loads((FIXTURES / n / "meta.json").read_text()) for n in NAMES]
    assert {m["architecture"] for m in metas} == {"Qwen3ForCausalLM", "Qwen2ForCausalLM", "Qwen3MoeForCausalLM",
                                                "LlamaForCausalLM"}
    assert {m["storage_dtype"] for m in metas} >= {"float32", "bfloat16", "float16"}
    assert {m["config_style"] for m in metas} == {"transformers4", "transformers5"}
    assert any(m["tie_word_embeddings"] for m in metas) and not all(m["tie_word_embeddings"] for m in metas)
    assert any(m["num_shards"] > 1 for m in metas)


@pytest.fixture(scope="module", params=NAMES)
def loaded(request):
    folder = FIXTURES / request.param
    return load_model(folder), np.load(folder / "golden.npz")


def test_logits_equal_golden(loaded):
    model, golden = loaded
    logits = model.logits(golden["input_ids"].tolist())
    assert logits.dtype == np.float32
    assert logits.shape == golden["logits"].shape
    tolerance = 1e-4 * max(1.0, float(np.abs(golden["logits"]).max()))
    assert float(np.abs(logits - golden["logits"]).max()) <= tolerance


def test_greedy_equals_golden(loaded):
    model, golden = loaded
    assert model.greedy(golden["prompt_ids"].tolist(), 32) == golden["greedy_ids"].tolist()


@pytest.mark.parametrize("chunk", [1, 5, 7])
def test_chunked_prefill_and_decode_equal_full_forward(loaded, chunk):
    model, golden = loaded
    ids = golden["input_ids"].tolist()
    full = model.logits(ids)
    cache = model.new_cache()
    split = len(ids) // 2
    rows = [model.step(cache, ids[s : min(s + chunk, split)], all_logits=True) for s in range(0, split, chunk)]
    rows += [model.step(cache, [token], all_logits=True) for token in ids[split:]]
    stepped = np.concatenate(rows)
    assert cache.length == len(ids)
    assert float(np.abs(stepped - full).max()) <= 1e-5 * max(1.0, float(np.abs(full).max()))
