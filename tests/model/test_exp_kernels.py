"""The compiled exponentials (_kernels.portable.exp): accuracy, special values, and their numpy fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._model.cache import kv_storage
from kestrel_trio._model.decoder import layers

pytestmark = pytest.mark.skipif(not _kernels.ready(), reason="numba cannot run here: the numpy paths are the only ones")


def _exp_through_softmax(x: np.ndarray) -> np.ndarray:
    """e^x of float32 ``x`` [n], as the softmax loop computes it (a 0 appended, so the row's max is 0)."""
    row = np.concatenate([x, [np.float32(0)]]).astype(np.float32).reshape(1, -1)  # [1, n+1]
    _kernels.softmax_numerators(row)
    return row[0, :-1]


def test_the_exponential_is_within_one_and_a_half_ulp_wherever_e_to_the_x_is_a_normal_float():
    x = np.linspace(-87.3, 0, 1_000_001, dtype=np.float32)  # softmax's numerators: s - max <= 0
    got = _exp_through_softmax(x).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    ulps = np.abs(got - want) / np.spacing(want.astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 1.5, f"{ulps.max():.2f} ulp at x = {x[ulps.argmax()]}"


def test_the_exponential_of_minus_infinity_and_of_very_small_x_is_zero_and_nan_stays_nan():
    got = _exp_through_softmax(np.float32([-np.inf, -1000.0, -87.34, -87.33, 0.0, -0.0]))
    assert got[0] == 0.0 and got[1] == 0.0 and got[2] == 0.0  # a masked key weighs exactly nothing
    assert 1.17e-38 < got[3] < 1.2e-38 and got[4] == 1.0 and got[5] == 1.0
    row = np.float32([[1.0, np.nan, 2.0]])
    sums = _kernels.softmax_numerators(row)
    assert np.isnan(sums[0, 0])  # as numpy: a NaN score makes the row NaN, not a silent number


def test_softmax_numerators_match_numpy_on_attention_shaped_scores():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((3, 10, 77), dtype=np.float32) * 8  # [h, rows, seen]
    scores[:, :, 70:] = -np.inf  # masked keys
    want = np.exp(scores - scores.max(axis=-1, keepdims=True))
    got = scores.copy()
    sums = _kernels.softmax_numerators(got)
    assert sums.shape == (3, 10, 1)
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)
    np.testing.assert_allclose(sums, want.sum(axis=-1, keepdims=True), rtol=1e-6)
    assert np.all(got[:, :, 70:] == 0)


def test_softmax_numerators_leave_what_they_cannot_take_to_numpy():
    strided = np.zeros((4, 8), np.float32)[:, ::2]
    assert _kernels.softmax_numerators(strided) is None
    assert _kernels.softmax_numerators(np.zeros((2, 3), np.float64)) is None
    scores = np.float32([[[0.0, 1.0, -np.inf]]])[:, :, ::1].copy()
    np.testing.assert_allclose(kv_storage.softmax_numerators(scores), [[[1 + np.e ** -1]]], rtol=1e-6)


def test_swiglu_matches_silu_times_up_in_float64_and_keeps_numpy_s_special_values():
    rng = np.random.default_rng(1)
    gate_up = rng.standard_normal((5, 2 * 300), dtype=np.float32) * 6  # [N, 2*inter]
    gate_up[0, :4] = [np.nan, -np.inf, -100.0, 100.0]
    g, u = gate_up[:, :300].astype(np.float64), gate_up[:, 300:].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        want = g / (1 + np.exp(-g)) * u
    got = layers.swiglu(gate_up)  # [N, inter]
    assert got.shape == (5, 300) and got.dtype == np.float32
    assert np.isnan(got[0, 0]) and np.isnan(got[0, 1])  # -inf * sigmoid(-inf) is NaN in numpy too
    np.testing.assert_allclose(got[:, 2:], want[:, 2:], rtol=1e-6, atol=1e-30)


def test_swiglu_without_the_compiled_loop_rounds_as_numpy(monkeypatch):
    rng = np.random.default_rng(2)
    gate_up = rng.standard_normal((3, 64), dtype=np.float32)  # [N, 2*inter]
    compiled = layers.swiglu(gate_up)
    monkeypatch.setattr(_kernels, "swiglu", lambda gate_up: None)
    gate, up = gate_up[:, :32], gate_up[:, 32:]
    np.testing.assert_array_equal(layers.swiglu(gate_up), layers.silu(gate) * up)
    np.testing.assert_allclose(compiled, layers.silu(gate) * up, rtol=1e-6, atol=1e-7)


def test_one_query_s_attention_over_a_kv_cache_takes_the_compiled_call_and_equals_numpy_s(monkeypatch):
    from kestrel_trio._model.cache.kv_cache import KVCache

    rng = np.random.default_rng(3)
    cache = KVCache(1, 2, 16)  # 1 layer, 2 kv heads of 16
    cache.reserve(37)
    cache.write(0, *rng.standard_normal((2, 37, 2, 16), dtype=np.float32))  # 37 tokens
    cache.commit(37)
    cache.reserve(1)
    q = rng.standard_normal((1, 6, 16), dtype=np.float32)  # [1, n_heads, head_dim]: groups of 3
    keys, values = cache.write(0, *rng.standard_normal((2, 1, 2, 16), dtype=np.float32))  # [2, 38, 16] views
    assert keys.base is not None and keys.shape[1] < keys.base.shape[1]  # a prefix of the cache's buffer
    assert _kernels.decode_attention(q[0], keys, values, 0.25) is not None
    compiled = layers.causal_attention(q, keys, values, 37, 0.25)  # [1, 96]
    monkeypatch.setattr(_kernels, "decode_attention", lambda *args: None)
    numpy_path = layers.causal_attention(q, keys, values, 37, 0.25)
    np.testing.assert_allclose(compiled, numpy_path, rtol=2e-6, atol=2e-7)


def test_one_query_s_attention_over_keys_that_are_not_a_buffer_s_prefix_is_left_to_numpy():
    keys = np.zeros((2, 10, 16), np.float32)[:, ::2]  # every other token: not a prefix
    assert _kernels.decode_attention(np.zeros((4, 16), np.float32), keys, keys, 0.25) is None
    assert _kernels.decode_attention(np.zeros((4, 16), np.float32), keys.astype(np.float16), keys, 0.25) is None
