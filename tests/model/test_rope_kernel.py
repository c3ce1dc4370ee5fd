"""The compiled rotary embedding gives numpy's values bit for bit, on contiguous and strided queries."""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._model.decoder import rope as rope_module
from kestrel_trio._model.decoder.rope import Rope, _apply_rope_numpy, apply_rope
from kestrel_trio._model.checkpoints.config import RopeConfig


@pytest.mark.parametrize(("tokens", "heads", "head_dim"), [(1, 16, 128), (256, 8, 64), (7, 3, 32)])
def test_the_compiled_rotation_equals_numpys_bit_for_bit(tokens, heads, head_dim):
    rng = np.random.default_rng(tokens)
    fused = rng.standard_normal((tokens, heads * head_dim + 40), dtype=np.float32)  # [T, q + more]
    x = fused[:, 20 : 20 + heads * head_dim].reshape(tokens, heads, head_dim)  # a strided view, as q of a fused qkv
    cos, sin = Rope.build(RopeConfig(rope_theta=1e6), head_dim).cos_sin(np.arange(tokens) + 5)  # [T, head_dim/2]
    compiled = _kernels.rotate_half(x, cos, sin)  # [T, heads, head_dim]
    assert compiled is not None, _kernels.unavailable_reason()
    expected = _apply_rope_numpy(x, cos, sin)
    assert compiled.dtype == np.float32 and np.array_equal(compiled, expected)
    assert not np.array_equal(compiled, x)  # it did rotate


def test_apply_rope_takes_the_compiled_pass_and_falls_back_to_numpy(monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 2, 32), dtype=np.float32)
    cos, sin = Rope.build(RopeConfig(rope_theta=1e4), 32).cos_sin(np.arange(4))
    calls = []
    real = _kernels.rotate_half
    monkeypatch.setattr(_kernels, "rotate_half", lambda *a: calls.append(1) or real(*a))
    compiled = apply_rope(x, cos, sin)
    assert calls == [1]
    monkeypatch.setattr(rope_module._kernels, "rotate_half", lambda *a: None)  # as where numba cannot run
    assert np.array_equal(apply_rope(x, cos, sin), compiled)
