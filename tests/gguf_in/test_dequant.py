"""kestrel's ggml dequantization equals gguf's reference (llama.cpp's Python package) bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")  # a test dependency: the reference dequantization

from gguf_kit import random_rows  # noqa: E402

from kestrel_trio._model.forms.dequant import GGML_TYPE_BY_NAME, expand_rows  # noqa: E402

SUPPORTED = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
def reference(name: str, raw: np.ndarray) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]), dtype=np.float32)


def assert_bits_equal(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.float32
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("name", SUPPORTED)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_valid_blocks_expand_exactly_as_gguf_does(name, seed):
    raw = random_rows(name, rows=37, cols=512, seed=seed)
    assert_bits_equal(expand_rows(GGML_TYPE_BY_NAME[name], raw), reference(name, raw))


@pytest.mark.parametrize("name", [n for n in SUPPORTED if n not in ("Q4_K", "Q5_K", "Q6_K")])
def test_gguf_quantized_weights_expand_exactly_as_gguf_does(name):
    rng = np.random.default_rng(7)
    weights = rng.standard_normal((64, 256), dtype=np.float32) * np.float32(0.2)  # [64, 256]
    weights[3] = 0.0  # an all-zero block row: scale 0
    stored = np.asarray(gguf.quants.quantize(weights, gguf.GGMLQuantizationType[name]))
    raw = stored.view(np.uint8).reshape(64, -1)  # [64, row_bytes]
    assert_bits_equal(expand_rows(GGML_TYPE_BY_NAME[name], raw), reference(name, raw))


@pytest.mark.parametrize("name", SUPPORTED)
def test_any_set_of_rows_expands_on_its_own(name, monkeypatch):
    """A chunk, a permutation or one expert's rows expand to exactly those rows of the whole."""
    raw = random_rows(name, rows=50, cols=256, seed=3)
    whole = expand_rows(GGML_TYPE_BY_NAME[name], raw)
    for rows in (np.arange(7, 19), np.array([49, 0, 13, 13, 2]), np.arange(50)[::-3]):
        assert_bits_equal(expand_rows(GGML_TYPE_BY_NAME[name], raw[rows]), whole[rows])
    # Chunked expansion (a few rows per step) into a slice of a larger buffer gives the same bits.
    monkeypatch.setattr("kestrel_trio._model.forms.dequant.CHUNK_WEIGHTS", 3 * 256)
    out = np.full((60, 256), np.nan, dtype=np.float32)
    expand_rows(GGML_TYPE_BY_NAME[name], raw, out[5:55])
    assert_bits_equal(out[5:55], whole)
    assert np.isnan(out[:5]).all() and np.isnan(out[55:]).all()


def test_every_type_kestrel_reads_is_one_gguf_knows_by_the_same_id_and_geometry():
    for name, t in GGML_TYPE_BY_NAME.items():
        qtype = gguf.GGMLQuantizationType[name]
        assert int(qtype) == t.type_id
        assert gguf.GGML_QUANT_SIZES[qtype] == (t.block_size, t.type_size)
    assert sorted(GGML_TYPE_BY_NAME) == sorted(SUPPORTED)
