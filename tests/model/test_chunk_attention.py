"""Causal attention of float32 prefill chunks in kestrel's own kernel (kestrel_trio._kernels.x86.float32.attention):
float32's accuracy at every shape (groups of 1 to 7 query heads a kv head, blocks of rows part-filled, keys before
the chunk or none), the causal mask exact, and taken by causal_attention for chunks only. Each register block
the CPU executes (the plan's runnable variants: AVX-512's and AVX2's on an x86-64 CPU with AVX-512, AVX2's on
others with AVX2); elsewhere the tests skip with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._kernels import loaded
from kestrel_trio._model.decoder import layers


def _planned():
    from kestrel_trio._kernels.plan import this_plan

    return this_plan().chunk_attention


_CHOICE = _planned() if _kernels.ready() else None
_WHY_NOT = _kernels.unavailable_reason() if _CHOICE is None else _CHOICE.why
pytestmark = [pytest.mark.host_cpu, pytest.mark.skipif(_CHOICE is None or _CHOICE.variant == "none", reason=_WHY_NOT)]
# The register blocks by the plan's variants: 32 lanes (AVX-512), 16 (AVX2).
_LANES = {"avx512": 32, "avx2": 16}
_RUNNABLE = _CHOICE.runnable if _CHOICE is not None else ()


@pytest.fixture(autouse=True)
def _enabled():
    assert _kernels.enable_prefill_attention() is None


@pytest.fixture(params=[pytest.param(v, marks=pytest.mark.skipif(v not in _RUNNABLE,
                                                                  reason=f"this host cannot run {v}"))
                        for v in _LANES], ids=lambda variant: f"{_LANES[variant]}-lanes")
def lanes(request, monkeypatch):
    """Each register block the CPU executes (the plan's runnable variants), as the one prefill_attention takes."""
    monkeypatch.setitem(loaded._state, "attention", _LANES[request.param])
    return _LANES[request.param]


def test_the_block_enabled_is_the_plans_choice():
    assert loaded._state["attention"] == _LANES[_CHOICE.variant]


def _serially(tasks):
    for task in tasks:
        task()


def _split(parts: int):
    return lambda items: [(items * p // parts, items * (p + 1) // parts) for p in range(parts)]


def _cache(rng, n_kv: int, total: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys and values as a KV cache holds them: the first ``total`` of a longer buffer, [n_kv, total, head_dim]."""
    buffer = rng.standard_normal((2, n_kv, total + 37, head_dim), dtype=np.float32)  # [2, n_kv, capacity, hd]
    return buffer[0, :, :total], buffer[1, :, :total]


def _exact(q: np.ndarray, keys: np.ndarray, values: np.ndarray, past: int, scale: float) -> np.ndarray:
    """Causal grouped-query attention in float64: [T, n_heads * head_dim]."""
    t, n_heads, head_dim = q.shape
    group = n_heads // keys.shape[0]
    k = np.repeat(keys.astype(np.float64), group, axis=0)  # [n_heads, S, hd]
    v = np.repeat(values.astype(np.float64), group, axis=0)  # [n_heads, S, hd]
    scores = np.einsum("thd,hsd->hts", q.astype(np.float64), k) * scale  # [n_heads, T, S]
    scores[:, np.arange(past + t)[None, :] > past + np.arange(t)[:, None]] = -np.inf
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))  # [n_heads, T, S]
    out = np.einsum("hts,hsd->thd", weights / weights.sum(axis=-1, keepdims=True), v)  # [T, n_heads, hd]
    return out.reshape(t, n_heads * head_dim)


@pytest.mark.parametrize("t, past, n_heads, n_kv, head_dim", [
    (2, 0, 4, 2, 32), (20, 17, 4, 2, 32),  # 4 rows (one part-filled register block), 40 rows
    (63, 0, 16, 8, 128), (64, 1, 16, 8, 128),  # 126 rows (9 blocks of 14, 21 of 6), 128 (the last part-filled)
    (130, 300, 14, 2, 64),  # a group of 7
    (200, 0, 8, 8, 64),  # a group of 1: one row a query
    (33, 5, 32, 8, 128),  # a group of 4
    (256, 256, 16, 8, 128),  # Qwen3-0.6B's second chunk of a 512-token prompt
])
@pytest.mark.parametrize("shares", [1, 2, 3])
def test_the_attention_has_float32_accuracy(t, past, n_heads, n_kv, head_dim, shares, lanes):
    rng = np.random.default_rng(t * 1000 + past + n_heads)
    q = rng.standard_normal((t, n_heads, head_dim), dtype=np.float32) * 2  # [T, n_heads, hd]: peaked softmaxes
    keys, values = _cache(rng, n_kv, past + t, head_dim)
    scale = head_dim**-0.5
    got = _kernels.prefill_attention(q, keys, values, past, scale, _serially, _split(shares))
    assert got is not None and got.shape == (t, n_heads * head_dim) and got.dtype == np.float32
    exact = _exact(q, keys, values, past, scale)
    # Outputs are averages of values of about 1: float32's sums over a few hundred keys are good to about 1e-6.
    assert np.abs(got - exact).max() < 1e-5
    assert np.abs(layers.causal_attention(q, keys, values, past, scale) - exact).max() < 1e-5


@pytest.mark.parametrize("poisoned", [0, 40, 299, 300, 301, 428])
def test_a_query_sees_no_key_after_its_own(poisoned, lanes):
    # A NaN key at ``poisoned`` (past 300, 129 new tokens) makes NaN exactly the queries that see it: the scores
    # after a query's own key are set to 0, not computed from. (Its value would reach the queries before it, as
    # 0 x NaN in the weighted sum, as in numpy's way: a model that made it has already failed for that token.)
    rng = np.random.default_rng(poisoned)
    t, past = 129, 300
    q = rng.standard_normal((t, 16, 128), dtype=np.float32)  # [T, n_heads, hd]
    keys, values = _cache(rng, 8, past + t, 128)
    keys[3, poisoned, 5] = np.nan
    got = _kernels.prefill_attention(q, keys, values, past, 128**-0.5, _serially, _split(2))  # [T, 16*128]
    seeing = np.arange(t) + past >= poisoned  # [T]
    head_columns = got.reshape(t, 8, 2 * 128)[:, 3]  # [T, 2*128]: kv head 3's query heads
    assert np.isnan(head_columns[seeing]).any(axis=1).all()
    assert np.isfinite(head_columns[~seeing]).all()
    assert np.isfinite(np.delete(got.reshape(t, 8, 256), 3, axis=1)).all()  # the other heads untouched


def test_a_nan_score_makes_its_row_nan_whatever_the_maximum_gives(lanes):
    rng = np.random.default_rng(1)
    t = 40
    q = rng.standard_normal((t, 4, 32), dtype=np.float32)  # [T, n_heads, hd]
    keys, values = _cache(rng, 2, t, 32)
    keys[0, 10, 0] = np.nan  # key 10's scores: NaN for every query that sees it
    got = _kernels.prefill_attention(q, keys, values, 0, 0.2, None, None).reshape(t, 2, 64)  # [T, n_kv, 2*32]
    assert np.isnan(got[10:, 0]).all() and np.isfinite(got[:10, 0]).all() and np.isfinite(got[:, 1]).all()


@pytest.mark.parametrize("t, dtype, head_dim, taken", [
    (1, np.float32, 128, False),  # a decode step: its own compiled call
    (2, np.float32, 128, False), (31, np.float32, 128, False),  # a verify step's few queries: numpy's way
    (32, np.float32, 128, True), (256, np.float32, 64, True),
    (40, np.float16, 128, False),  # a float16 cache: widened as read, in numpy
    (40, np.float32, 48, False),  # head_dim not a multiple of 32
])
def test_causal_attention_takes_the_kernel_for_float32_chunks(monkeypatch, t, dtype, head_dim, taken):
    calls = []
    real = _kernels.prefill_attention
    monkeypatch.setattr(_kernels, "prefill_attention", lambda *a: (calls.append(a), real(*a))[1])
    rng = np.random.default_rng(t)
    q = rng.standard_normal((t, 4, head_dim), dtype=np.float32)  # [T, n_heads, hd]
    keys, values = (a.astype(dtype) for a in _cache(rng, 2, 10 + t, head_dim))
    got = layers.causal_attention(q, keys, values, 10, head_dim**-0.5)
    assert (bool(calls) and real(*calls[0]) is not None) == taken
    assert bool(calls) == (t >= layers.CHUNK_ATTENTION_MIN_QUERIES)
    exact = _exact(q, keys.astype(np.float32), values.astype(np.float32), 10, head_dim**-0.5)
    assert np.abs(got - exact).max() < 1e-5


def test_shapes_that_disagree_are_left_to_numpy(lanes):
    # The kernel reads past + T keys without bounds checks: any other count, or values unlike the keys, is refused.
    rng = np.random.default_rng(3)
    q = rng.standard_normal((8, 4, 32), dtype=np.float32)  # [T, n_heads, hd]
    keys, values = _cache(rng, 2, 20, 32)  # [2, 20, 32] each
    assert _kernels.prefill_attention(q, keys, values, 12, 0.2, None, None) is not None
    for past in (11, 13):
        assert _kernels.prefill_attention(q, keys, values, past, 0.2, None, None) is None
    assert _kernels.prefill_attention(q, keys, values[:, :, :16], 12, 0.2, None, None) is None
    assert _kernels.prefill_attention(q[:, :3], keys, values, 12, 0.2, None, None) is None  # 3 heads over 2
