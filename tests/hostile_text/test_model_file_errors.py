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
