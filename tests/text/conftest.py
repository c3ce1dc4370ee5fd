"""Shared fixtures of the text-layer tests: the real Qwen3 tokenizer, loaded once."""

from __future__ import annotations

from pathlib import Path

import pytest

from kestrel_trio.text import Tokenizer

# ../shared beside the checkout root (tests/text/conftest.py -> parents[2] is the root).
QWEN3_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "qwen3-tokenizer"


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    return QWEN3_DIR


@pytest.fixture(scope="session")
def qwen_tokenizer() -> Tokenizer:
    return Tokenizer.from_folder(QWEN3_DIR)
