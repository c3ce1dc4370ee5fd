"""Shared fixtures of the text-layer tests: the real Qwen3 tokenizer, loaded once.

The package ships the genuine Qwen3 tokenizer for its demo model
(``kestrel_trio/_demo``: tokenizer.json gzipped, tokenizer_config.json as
published). The tests lay those files out as an upstream checkpoint folder
would hold them, and check every byte against the upstream files' sha256, so
they need nothing outside the repository.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from importlib import resources
from pathlib import Path

import pytest

from kestrel_trio.text import Tokenizer

# sha256 of the files published with Qwen/Qwen3-0.6B (also recorded in kestrel_trio/_demo/NOTICE).
UPSTREAM_SHA256 = {
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "tokenizer_config.json": "d5d09f07b48c3086c508b30d1c9114bd1189145b74e982a265350c923acd8101",
    "chat_template.jinja": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
}


def upstream_files() -> dict[str, bytes]:
    """The upstream Qwen3 tokenizer files, rebuilt from the packaged demo copy."""
    demo = resources.files("kestrel_trio") / "_demo"
    config = demo.joinpath("tokenizer_config.json").read_bytes()
    return {
        "tokenizer.json": gzip.decompress(demo.joinpath("tokenizer.json.gz").read_bytes()),
        "tokenizer_config.json": config,
        # Upstream ships the template twice: in tokenizer_config.json and as chat_template.jinja.
        "chat_template.jinja": json.loads(config)["chat_template"].encode("utf-8"),
    }


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the real Qwen3 tokenizer files, each checked against its upstream sha256."""
    folder = tmp_path_factory.mktemp("qwen3-tokenizer")
    for name, data in upstream_files().items():
        assert hashlib.sha256(data).hexdigest() == UPSTREAM_SHA256[name], f"{name} differs from the upstream file"
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_dir: Path) -> Tokenizer:
    return Tokenizer.from_folder(qwen_dir)
