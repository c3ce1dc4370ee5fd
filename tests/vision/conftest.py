"""Fixtures shared by the Qwen3-VL engine and server suites."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kestrel_trio.model import Model, load_model

VL_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_vl"


@pytest.fixture(scope="module")
def vl_model() -> Model:
    """The tiny Qwen3-VL checkpoint written by transformers (needs Pillow)."""
    return load_model(VL_FIXTURE)


@pytest.fixture(scope="module")
def golden():
    """Its goldens: token ids, pixel values, logits and greedy continuations (vl_golden.npz)."""
    return np.load(VL_FIXTURE / "vl_golden.npz")
