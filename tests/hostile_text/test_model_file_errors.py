"""Issue 49 item 8: an error a model file causes names the file and field (here: an end-of-sequence id)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile_text_kit import copy_fixture

from kestrel_trio.errors import ModelLoadError
from kestrel_trio.model import load_model


def test_an_eos_id_beyond_the_vocabulary_names_the_file(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path / "m")
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [10**9]}))
    with pytest.raises(ModelLoadError) as caught:
        load_model(folder)
    assert "generation_config.json" in caught.value.message and str(10**9) in caught.value.message


def test_a_panic_while_building_a_gguf_tokenizer_is_a_load_error_naming_the_file(monkeypatch) -> None:
    """pyo3's PanicException derives from BaseException: ``except Exception`` alone would let it end the process."""
    import tokenizers

    from kestrel_trio.text.tokens import gguf_vocab

    class PanicException(BaseException):  # as pyo3_runtime names it
        pass

    def panics(_text):
        raise PanicException("called `Option::unwrap()` on a `None` value\n<backtrace>")

    monkeypatch.setattr(tokenizers.Tokenizer, "from_str", staticmethod(panics))
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": ["a", "b"],
                "tokenizer.ggml.merges": []}
    with pytest.raises(ModelLoadError) as raised:
        gguf_vocab.backend_from_gguf(metadata, "hostile.gguf")
    assert str(raised.value) == ("hostile.gguf: the GGUF tokenizer cannot be built: "
                                 "called `Option::unwrap()` on a `None` value")
