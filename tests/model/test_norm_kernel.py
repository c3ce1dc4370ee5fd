"""The compiled RMS norm of a decode step's rows (_kernels.portable.norm) against numpy's, and where it is used."""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._model.decoder import layers

pytestmark = pytest.mark.skipif(not _kernels.ready(), reason="numba cannot run here: the numpy path is the only one")


def _numpy_rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    squares = np.einsum("...i,...i->...", x, x)[..., None]  # [..., 1]
    return x * (np.float32(1.0) / np.sqrt(squares / np.float32(x.shape[-1]) + np.float32(eps))) * weight


def _ulps(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want).astype(np.float32))))


@pytest.mark.parametrize("rows", [1, 3, 32])
def test_hidden_rows_agree_with_numpy_to_a_few_ulp(rows):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 1024), dtype=np.float32) * 5  # [rows, hidden]
    weight = rng.standard_normal(1024, dtype=np.float32)  # [hidden]
    got = _kernels.rms_norm(x, weight, 1e-6)
    assert got.shape == x.shape and got.dtype == np.float32
    assert _ulps(got, _numpy_rms_norm(x, weight, 1e-6)) <= 8  # the sum of squares in another order: the scale's ulp


def test_query_heads_as_a_strided_view_of_the_fused_projection_are_normed_per_head():
    rng = np.random.default_rng(7)
    qkv = rng.standard_normal((4, 16 * 64 + 2 * 4 * 64), dtype=np.float32)  # [T, (16 + 2*4) * 64]
    q = qkv[:, : 16 * 64].reshape(4, 16, 64)  # [T, heads, head_dim], not contiguous
    weight = rng.standard_normal(64, dtype=np.float32)  # [head_dim]
    got = _kernels.rms_norm(q, weight, 1e-6)
    assert got.shape == (4, 16, 64) and got.flags.c_contiguous
    assert _ulps(got, _numpy_rms_norm(q, weight, 1e-6)) <= 8
    assert np.array_equal(qkv[:, : 16 * 64].reshape(4, 16, 64), q)  # the input is not written


def test_a_zero_row_stays_zero_and_eps_is_inside_the_root():
    weight = np.ones(8, dtype=np.float32)  # [d]
    got = _kernels.rms_norm(np.zeros((1, 8), dtype=np.float32), weight, 1e-6)
    assert np.array_equal(got, np.zeros((1, 8), dtype=np.float32))
    x = np.full((1, 8), 1e-4, dtype=np.float32)  # mean square 1e-8, well below eps
    assert np.allclose(_kernels.rms_norm(x, weight, 1e-2), x / np.sqrt(np.float32(1e-8 + 1e-2)), rtol=1e-6)


def test_layers_use_it_for_a_decode_step_and_a_prefill_chunk_alike(monkeypatch):
    calls = []
    real = _kernels.rms_norm
    monkeypatch.setattr(_kernels, "rms_norm", lambda *args: calls.append(args[0].shape) or real(*args))
    weight = np.ones(16, dtype=np.float32)  # [d]
    rng = np.random.default_rng(3)
    small = rng.standard_normal((2, 16), dtype=np.float32)  # [rows, d]
    big = rng.standard_normal((300, 16), dtype=np.float32)  # [rows, d]
    layers.rms_norm(small, weight, 1e-6)
    got = layers.rms_norm(big, weight, 1e-6)
    assert calls == [small.shape, big.shape]
    assert _ulps(got, _numpy_rms_norm(big, weight, 1e-6)) <= 8


def test_a_prefill_chunks_query_heads_agree_with_numpy():
    rng = np.random.default_rng(11)
    qkv = rng.standard_normal((300, (16 + 2 * 8) * 128), dtype=np.float32) * 3  # [T, (16 + 2*8) * head_dim]
    k = qkv[:, 16 * 128 : 24 * 128].reshape(300, 8, 128)  # [T, n_kv, head_dim]: starts inside the row
    weight = rng.standard_normal(128, dtype=np.float32)  # [head_dim]
    assert _ulps(_kernels.rms_norm(k, weight, 1e-6), _numpy_rms_norm(k, weight, 1e-6)) <= 8


def test_reversed_or_unaligned_views_and_the_numpy_fallback_give_numpys_result(monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3, 8), dtype=np.float32)  # [T, heads, d]
    weight = rng.standard_normal(8, dtype=np.float32)  # [d]
    assert _kernels.rms_norm(x[:, :, ::-1], weight, 1e-6) is None  # dim not unit-stride
    assert _kernels.rms_norm(x[::-1], weight, 1e-6) is None  # a negative row stride
    assert _kernels.rms_norm(x, weight[::-1], 1e-6) is None  # a strided weight
    odd = np.frombuffer(b"\0\0" + x.tobytes(), dtype=np.uint8)[2:].view(np.float32).reshape(x.shape)  # unaligned
    assert np.allclose(layers.rms_norm(odd, weight, 1e-6), _numpy_rms_norm(x, weight, 1e-6), rtol=1e-5)
    monkeypatch.setattr(_kernels, "rms_norm", lambda *args: None)  # numba absent: layers' numpy path
    assert _ulps(layers.rms_norm(x, weight, 1e-6), _numpy_rms_norm(x, weight, 1e-6)) == 0


def test_other_dtypes_are_left_to_numpy():
    weight = np.ones(4, dtype=np.float32)  # [d]
    assert _kernels.rms_norm(np.zeros((1, 4), dtype=np.float64), weight, 1e-6) is None
    assert _kernels.rms_norm(np.zeros((1, 4), dtype=np.float32), weight.astype(np.float16), 1e-6) is None
    assert _kernels.rms_norm(np.zeros(4, dtype=np.float32), weight, 1e-6) is None
