"""A prefill chunk's queries, keys and values in one pass (kestrel_trio._kernels.qkv_rows): the same values as the
five passes it replaces (head norms, rotations, the cache write), written at the cache's position, refused without
writing anything where it cannot run, and taken by forward() for one sequence's chunks of a float32 cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import _kernels, load_model
from kestrel_trio._model import forward as forward_module
from kestrel_trio._model.decoder.layers import rms_norm
from kestrel_trio._model.decoder.rope import _apply_rope_numpy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
pytestmark = pytest.mark.skipif(not _kernels.ready(), reason=f"numba cannot run here: {_kernels.unavailable_reason()}")


def _serially(tasks):
    for task in tasks:
        task()


def _split(parts: int):
    return lambda items: [(items * p // parts, items * (p + 1) // parts) for p in range(parts)]


def _numpy_way(qkv, n_heads, n_kv, hd, q_norm, k_norm, cos, sin):
    """The five passes in numpy: [T, n_heads, hd] queries, [n_kv, T, hd] keys and values."""
    t = qkv.shape[0]
    q = qkv[:, : n_heads * hd].reshape(t, n_heads, hd)  # [T, n_heads, hd]
    k = qkv[:, n_heads * hd : (n_heads + n_kv) * hd].reshape(t, n_kv, hd)  # [T, n_kv, hd]
    v = qkv[:, (n_heads + n_kv) * hd :].reshape(t, n_kv, hd)  # [T, n_kv, hd]
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, 1e-6), rms_norm(k, k_norm, 1e-6)
    return _apply_rope_numpy(q, cos, sin), _apply_rope_numpy(k, cos, sin).transpose(1, 0, 2), v.transpose(1, 0, 2)


@pytest.mark.parametrize("normed", [True, False])
@pytest.mark.parametrize("t, past, n_heads, n_kv, hd", [(1, 0, 2, 1, 8), (7, 5, 4, 2, 64), (33, 100, 16, 8, 128)])
@pytest.mark.parametrize("shares", [1, 2, 3])
def test_the_pass_gives_the_five_passes_values_at_the_caches_position(normed, t, past, n_heads, n_kv, hd, shares):
    rng = np.random.default_rng(t + past + shares)
    qkv = rng.standard_normal((t, (n_heads + 2 * n_kv) * hd), dtype=np.float32) * 3  # [T, width]
    q_norm, k_norm = (rng.random((2, hd), dtype=np.float32) + 0.5) if normed else (None, None)
    angles = rng.random((t, hd // 2)) * 6  # [T, hd/2]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    keys, values = np.full((2, n_kv, past + t + 9, hd), 7.0, dtype=np.float32)  # [n_kv, capacity, hd] each
    q = _kernels.qkv_rows(qkv, n_heads, n_kv, hd, q_norm, k_norm, 1e-6, cos, sin, keys, values, past, _serially,
                          _split(shares))
    want_q, want_k, want_v = _numpy_way(qkv, n_heads, n_kv, hd, q_norm, k_norm, cos, sin)
    assert q.shape == (t, n_heads, hd)
    np.testing.assert_allclose(q, want_q, rtol=0, atol=2e-6 * np.abs(want_q).max())
    np.testing.assert_allclose(keys[:, past : past + t], want_k, rtol=0, atol=2e-6 * np.abs(want_k).max())
    np.testing.assert_array_equal(values[:, past : past + t], want_v)  # copied
    for buffer in (keys, values):  # nothing outside the chunk's slots
        assert (buffer[:, :past] == 7).all() and (buffer[:, past + t :] == 7).all()


def test_arrays_of_other_kinds_are_refused_with_nothing_written():
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((4, 4 * 8), dtype=np.float32)  # [T, (2 + 2*1) * 8]
    cos = sin = np.ones((4, 4), dtype=np.float32)  # [T, hd/2]
    keys, values = np.zeros((2, 1, 6, 8), dtype=np.float32)  # [n_kv, capacity, hd] each
    norm = np.ones(8, dtype=np.float32)  # [hd]
    refused = [
        (qkv, keys, values, 3, norm),  # past + T past the capacity
        (qkv.astype(np.float64), keys, values, 0, norm),
        (np.asfortranarray(qkv), keys, values, 0, norm),
        (qkv, keys.astype(np.uint16), values.astype(np.uint16), 0, norm),  # bf16 bits: the cache's write widens
        (qkv, keys, values, 0, norm[:4]),
    ]
    for x, k, v, past, q_norm in refused:
        assert _kernels.qkv_rows(x, 2, 1, 8, q_norm, norm, 1e-6, cos, sin, k, v, past, None, None) is None
        assert not k.any() and not v.any()
    assert _kernels.qkv_rows(qkv, 2, 1, 8, norm, norm, 1e-6, cos, sin, keys, values, 2, None, None) is not None


@pytest.mark.parametrize("name", ["qwen2_fp32", "qwen3_bf16_tied"])
@pytest.mark.parametrize("kv_dtype, taken", [("fp32", True), ("bf16", False)])
def test_forward_takes_it_for_one_sequences_chunks_and_its_logits_agree(monkeypatch, name, kv_dtype, taken):
    model = load_model(FIXTURES / name)
    ids = np.arange(3, 20, dtype=np.int64)  # [T]
    real, calls = _kernels.qkv_rows, []
    monkeypatch.setattr(_kernels, "qkv_rows", lambda *a: calls.append(a) or real(*a))
    fused = model.prefill(model.new_cache(kv_dtype), ids, chunk=8)  # [vocab]: chunks of 8, 8 and 1
    assert len(calls) == (2 * model.config.num_hidden_layers if taken else 0)  # the 8-token chunks' layers
    monkeypatch.setattr(_kernels, "qkv_rows", lambda *a: None)
    unfused = model.prefill(model.new_cache(kv_dtype), ids, chunk=8)  # [vocab]
    np.testing.assert_allclose(fused, unfused, rtol=0, atol=1e-5 * max(1.0, float(np.abs(unfused).max())))
