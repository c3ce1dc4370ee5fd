"""A GGUF file kestrel-trio cannot serve is one ModelLoadError that names the problem, before any serving."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from gguf_kit import rewrite_gguf  # noqa: E402
from kestrel_trio import load_model  # noqa: E402
from kestrel_trio.errors import ModelLoadError  # noqa: E402

GGUF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
QWEN2 = GGUF_FIXTURES / "qwen2_quant" / "qwen2_quant.gguf"
LLAMA = GGUF_FIXTURES / "llama_quant" / "llama_quant.gguf"


def _error(path: Path) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load_model(path)
    return caught.value.message


def _patched(tmp_path: Path, source: Path, edit: Callable[[bytearray], None]) -> Path:
    data = bytearray(source.read_bytes())
    edit(data)
    out = tmp_path / "broken.gguf"
    out.write_bytes(bytes(data))
    return out


def _rewritten(tmp_path: Path, source: Path, *, metadata: dict[str, Any] | None = None,
               drop: tuple[str, ...] = (), tensors: dict[str, np.ndarray] | None = None) -> Path:
    """``source`` copied with metadata changed or dropped and tensors dropped or added (gguf_kit.rewrite_gguf)."""
    return rewrite_gguf(source, tmp_path / "rewritten.gguf", metadata=metadata, drop=drop, tensors=tensors)


def test_the_rewriter_keeps_a_loadable_file(tmp_path):
    """The helper itself: a file passed through unchanged loads and computes as the original."""
    ids = [1, 2, 3, 4]
    assert np.array_equal(load_model(_rewritten(tmp_path, QWEN2)).logits(ids), load_model(QWEN2).logits(ids))


@pytest.mark.parametrize("keep, said", [
    (0, "broken.gguf: empty file, not a GGUF model"),
    (3, "broken.gguf: truncated GGUF file: the magic needs bytes up to 4, the file has 3"),
    (10, "broken.gguf: truncated GGUF file: the header needs bytes up to 16, the file has 10"),
    (30, "broken.gguf: truncated GGUF file: the header needs bytes up to 32, the file has 30"),
    (200, "broken.gguf: truncated GGUF file: a string needs bytes up to "),  # the metadata's first string
    (-1, "broken.gguf: file is truncated: tensor 'blk.1.ffn_up.weight' ends at byte"),
])
def test_a_truncated_file_is_named(tmp_path, keep, said):
    """Each cut names the file and what the bytes ran out in (each case its own message, none left to an 'or')."""
    size = QWEN2.stat().st_size
    keep = size - 1 if keep == -1 else keep
    path = _patched(tmp_path, QWEN2, lambda data: data.__delitem__(slice(keep, None)))
    message = _error(path)
    assert said in message
    assert message.endswith(f"the file has {keep}") or keep == 0


def test_a_file_cut_inside_its_tensor_data_names_the_tensor(tmp_path):
    path = _patched(tmp_path, QWEN2, lambda data: data.__delitem__(slice(len(data) - 100, None)))
    message = _error(path)
    assert "file is truncated: tensor 'blk.1.ffn_up.weight' ends at byte" in message  # the file's last tensor


def test_a_wrong_magic_is_named(tmp_path):
    path = _patched(tmp_path, QWEN2, lambda data: data.__setitem__(slice(0, 4), b"GGML"))
    assert "broken.gguf: not a GGUF file (starts with b'GGML'" in _error(path)


@pytest.mark.parametrize("version", [1, 4, 0x03000000])
def test_a_wrong_version_is_named(tmp_path, version):
    path = _patched(tmp_path, QWEN2, lambda data: data.__setitem__(slice(4, 8), struct.pack("<I", version)))
    message = _error(path)
    assert f"GGUF version {version}" in message and "is not supported" in message
    if version == 0x03000000:
        assert "big-endian" in message


@pytest.mark.parametrize("type_id", [16, 99])  # IQ2_XXS (a ggml type kestrel does not read), and no type at all
def test_an_unknown_tensor_type_is_named(tmp_path, type_id):
    def edit(data: bytearray) -> None:
        name = b"token_embd.weight"
        at = data.index(name) + len(name)
        (n_dims,) = struct.unpack_from("<I", data, at)
        struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)

    message = _error(_patched(tmp_path, QWEN2, edit))
    assert f"tensor 'token_embd.weight' has ggml type {type_id}, which kestrel-trio cannot read" in message


def test_an_unknown_architecture_is_named(tmp_path):
    path = _rewritten(tmp_path, QWEN2, metadata={"general.architecture": "mamba"})
    assert "GGUF architecture 'mamba' is not supported (supported: llama, qwen2, qwen3, qwen3moe, qwen3vl)" in _error(path)


def test_a_missing_hyperparameter_names_its_key(tmp_path):
    path = _rewritten(tmp_path, QWEN2, metadata={"qwen2.embedding_length": None})
    assert "GGUF metadata key qwen2.embedding_length is missing" in _error(path)


def test_a_shape_that_does_not_fit_the_config_names_the_gguf_tensor(tmp_path):
    path = _rewritten(tmp_path, QWEN2, metadata={"qwen2.attention.head_count_kv": 1})
    message = _error(path)
    assert ("tensor 'blk.0.attn_k.weight' (model.layers.0.self_attn.k_proj.weight) has shape [32, 64], "
            "the GGUF metadata implies [16, 64]") in message


def test_a_missing_tensor_names_the_gguf_tensor(tmp_path):
    path = _rewritten(tmp_path, QWEN2, drop=("blk.1.ffn_down.weight",))
    assert "tensor 'blk.1.ffn_down.weight' (model.layers.1.mlp.down_proj.weight) is missing" in _error(path)


def test_an_unexpected_tensor_is_named(tmp_path):
    path = _rewritten(tmp_path, QWEN2, tensors={"blk.0.ffn_extra.weight": np.zeros(64, dtype=np.float32)})
    assert "unexpected tensor 'blk.0.ffn_extra.weight' for Qwen2ForCausalLM" in _error(path)


def test_an_unsupported_pre_tokenizer_is_named(tmp_path):
    path = _rewritten(tmp_path, LLAMA, metadata={"tokenizer.ggml.pre": "falcon"})
    assert "GGUF pre-tokenizer 'falcon' is not supported (supported: qwen2, llama-bpe, smollm)" in _error(path)


def test_a_sentencepiece_tokenizer_is_named(tmp_path):
    path = _rewritten(tmp_path, LLAMA, metadata={"tokenizer.ggml.model": "llama"})
    assert "GGUF tokenizer model 'llama' is not supported" in _error(path)


def test_a_file_that_is_not_gguf_is_named(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    assert "notes.txt: not a GGUF file" in _error(path)
    assert "not a checkpoint folder or GGUF file" in _error(tmp_path / "absent.gguf")
