"""Pooled embeddings against transformers' goldens (tests/fixtures/make_embedding_goldens.py).

The fixture is a tiny Qwen3ForCausalLM written by transformers with a Qwen3-Embedding-style
``modules.json`` (last-token pooling). Every pooling is checked against the same final hidden states
transformers computed, fed in prefill chunks small enough that the 300-token input spans several.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kestrel_trio._model import EmbeddingRun, read_pooling
from kestrel_trio.errors import BadRequestError, ModelLoadError
from kestrel_trio.model import load_model

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_embedding"


@pytest.fixture(scope="module")
def model():
    return load_model(FOLDER, weights="fp32")


@pytest.fixture(scope="module")
def golden():
    return np.load(FOLDER / "embedding_golden.npz")


def inputs(golden) -> list[list[int]]:
    return [golden[f"ids_{i}"].tolist() for i in range(3)]


def run(model, ids, pooling: str, chunk: int) -> np.ndarray:
    job = EmbeddingRun(ids, pooling, chunk, lambda tokens: model.new_cache())
    steps = 0
    while not job.step(model.decoder):
        steps += 1
    assert steps + 1 == sum(-(-len(x) // chunk) for x in ids)  # one chunk per step
    return np.stack(job.vectors)  # [3, hidden]


def test_the_folder_says_last_token(model) -> None:
    assert model.pooling == "last"


@pytest.mark.parametrize("pooling", ["last", "mean", "cls"])
@pytest.mark.parametrize("chunk", [7, 512])
def test_pooled_vectors_match_transformers(model, golden, pooling: str, chunk: int) -> None:
    got = run(model, inputs(golden), pooling, chunk)
    want = golden[pooling]  # [3, hidden], unit rows
    assert got.shape == want.shape
    error = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)  # [3]
    assert error.max() < 1e-4, error
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def _folder_with(tmp_path: Path, pooling_config: dict | None, modules: list | None) -> Path:
    folder = tmp_path / "m"
    folder.mkdir(parents=True)
    if modules is not None:
        (folder / "modules.json").write_text(json.dumps(modules))
    if pooling_config is not None:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    return folder


POOLING_MODULES = [{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]


def test_pooling_is_read_from_the_sentence_transformers_files(tmp_path: Path) -> None:
    assert read_pooling(None) == "last"
    assert read_pooling(_folder_with(tmp_path / "a", None, None)) == "last"  # a plain decoder LM
    mean = {"pooling_mode_mean_tokens": True, "pooling_mode_lasttoken": False}
    assert read_pooling(_folder_with(tmp_path / "b", mean, POOLING_MODULES)) == "mean"
    cls = {"pooling_mode_cls_token": True}
    assert read_pooling(_folder_with(tmp_path / "c", cls, POOLING_MODULES)) == "cls"


def test_a_pooling_it_cannot_compute_is_refused_at_load(tmp_path: Path) -> None:
    folder = _folder_with(tmp_path, {"pooling_mode_max_tokens": True}, POOLING_MODULES)
    with pytest.raises(ModelLoadError, match="pooling_mode_max_tokens"):
        read_pooling(folder)


def test_a_mean_pooling_folder_loads_as_mean(tmp_path: Path, golden) -> None:
    folder = tmp_path / "mean"
    shutil.copytree(FOLDER, folder)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    assert load_model(folder, weights="fp32").pooling == "mean"


def test_a_text_is_tokenized_with_the_tokenizers_own_special_tokens(tmp_path: Path) -> None:
    """Qwen3-Embedding's tokenizer appends <|endoftext|> (its post-processor), whose hidden state is pooled."""
    source = FOLDER.parent / "qwen3_bf16_tied"
    plain = load_model(source)
    assert plain.encode_for_embedding("hello world", param="input") == plain.encode("hello world")
    folder = tmp_path / "embedder"
    shutil.copytree(source, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [504], "tokens": ["<|endoftext|>"]}},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    embedder = load_model(folder)
    assert embedder.encode_for_embedding("hello world", param="input") == plain.encode("hello world") + [504]
    with pytest.raises(BadRequestError, match="'input' encodes to no tokens"):
        plain.encode_for_embedding("", param="input")
