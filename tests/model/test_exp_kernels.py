"""The compiled exponential (kestrel_trio._kernels.exp): accuracy, special values, SwiGLU and its numpy fallback."""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._model import layers

pytestmark = pytest.mark.skipif(not _kernels.ready(), reason="numba cannot run here: the numpy paths are the only ones")


def _exp(x: np.ndarray) -> np.ndarray:
    """e^x of float32 ``x`` [n] by the compiled exponential (called from a loop, as SwiGLU calls it)."""
    from numba import njit

    from kestrel_trio._kernels import exp

    @njit(error_model="numpy")
    def each(values, out):
        for i in range(values.size):
            out[i] = exp._exp(values[i])

    out = np.empty_like(x)
    each(x, out)
    return out


def test_the_exponential_is_within_one_and_a_half_ulp_wherever_e_to_the_x_is_a_normal_float():
    x = np.linspace(-87.3, 88.7, 1_000_001, dtype=np.float32)
    got = _exp(x).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    ulps = np.abs(got - want) / np.spacing(want.astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 1.5, f"{ulps.max():.2f} ulp at x = {x[ulps.argmax()]}"


def test_the_exponential_of_minus_infinity_and_of_very_small_x_is_zero_large_x_inf_and_nan_stays_nan():
    got = _exp(np.float32([-np.inf, -1000.0, -87.34, -87.33, 0.0, -0.0, 88.8, np.inf, np.nan]))
    assert got[0] == 0.0 and got[1] == 0.0 and got[2] == 0.0
    assert 1.17e-38 < got[3] < 1.2e-38 and got[4] == 1.0 and got[5] == 1.0
    assert got[6] == np.inf and got[7] == np.inf and np.isnan(got[8])


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
