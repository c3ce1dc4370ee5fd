"""forward() computes the last layer only for the rows whose logits it returns, and changes no logit or cache entry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import load_model
from kestrel_trio._model import forward

from kernel_plan_kit import without_compiled_loops

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODELS = ["qwen2_fp32", "qwen3_bf16_tied", "qwen3_moe"]


def stored(cache) -> list[np.ndarray]:
    """Every layer's keys and values up to the cache's length, [n_kv, length, head_dim] each."""
    return [part[:, : cache.length].copy() for layer in zip(cache.keys, cache.values) for part in layer]


def close(a: np.ndarray, b: np.ndarray) -> None:
    # The trimmed layer attends one query alone (the one-query path) where the full one ran a block of them:
    # the same sums in another order.
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(1.0, float(np.abs(b).max())))


@pytest.fixture(params=["compiled", "numpy"])
def loops(request, monkeypatch) -> str:
    """Either way attention runs: numba's one-query loop, or numpy's blocks (which read ``past``)."""
    if request.param == "numpy":
        without_compiled_loops(monkeypatch)
    return request.param


def batch(model, seed: int):
    """Three sequences stepping together: a 5-token chunk, a decode row after 6 tokens, a 4-token chunk."""
    rng = np.random.default_rng(seed)
    caches = [model.new_cache() for _ in range(3)]
    model.step(caches[1], rng.integers(0, model.config.vocab_size, size=6))
    lengths = [5, 1, 4]
    ids = rng.integers(0, model.config.vocab_size, size=sum(lengths))  # [N]
    positions = np.concatenate([np.arange(c.length, c.length + n) for c, n in zip(caches, lengths)])  # [N]
    return caches, ids, positions, lengths


@pytest.mark.parametrize("name", MODELS)
def test_the_wanted_segments_logits_and_every_cache_entry_equal_the_untrimmed_pass(name, loops):
    model = load_model(FIXTURES / name)
    full_caches, ids, positions, lengths = batch(model, seed=1)
    every_row = forward(model.decoder, ids, positions, full_caches, lengths, all_logits=True)  # [N, vocab]
    caches, *_ = batch(model, seed=1)
    wanted = forward(model.decoder, ids, positions, caches, lengths, wanted=[True, False, True])  # [2, vocab]
    last_rows = np.cumsum(lengths) - 1  # [3]
    assert wanted.shape == (2, model.config.vocab_size)
    close(wanted, every_row[last_rows[[0, 2]]])
    for trimmed, full in zip(caches, full_caches):
        assert trimmed.length == full.length
        for a, b in zip(stored(trimmed), stored(full)):
            np.testing.assert_array_equal(a, b)  # the last layer still writes every row's keys and values
    every_last = forward(model.decoder, ids, positions, [model.new_cache() for _ in range(3)], [5, 1, 4])
    assert every_last.shape == (3, model.config.vocab_size)  # wanted=None: every segment's last row


@pytest.mark.parametrize("name", MODELS)
def test_a_chunk_whose_logits_nobody_wants_returns_none_and_the_next_step_is_unchanged(name, loops):
    model = load_model(FIXTURES / name)
    ids = np.arange(3, 14, dtype=np.int64)  # [T]
    reference = model.step(model.new_cache(), ids, all_logits=True)  # [T, vocab]
    cache = model.new_cache()
    nothing = forward(model.decoder, ids[:7], np.arange(7), [cache], [7], wanted=[False])
    assert nothing.shape == (0, model.config.vocab_size)
    assert cache.length == 7
    close(model.step(cache, ids[7:], all_logits=True), reference[7:])


@pytest.mark.parametrize("name", MODELS)
def test_a_chunked_prefill_returns_the_last_position_s_logits(name):
    model = load_model(FIXTURES / name)
    ids = list(range(3, 14))
    reference = model.logits(ids)[-1]  # [vocab]
    for chunk in (4, 11, 32):
        cache = model.new_cache()
        close(model.prefill(cache, ids, chunk=chunk), reference)
        assert cache.length == len(ids)


def test_a_chunked_prefill_makes_room_for_the_whole_prompt_once():
    model = load_model(FIXTURES / "qwen2_fp32")
    cache = model.new_cache()
    capacities = []
    reserve = cache.reserve

    def reserving(new_tokens: int) -> None:
        reserve(new_tokens)
        capacities.append(cache.capacity)

    cache.reserve = reserving
    model.prefill(cache, list(range(3, 203)), chunk=32)  # 7 chunks
    assert cache.length == 200
    assert capacities[0] >= 200  # the first reserve made room for all: no copy as each chunk came
    assert set(capacities) == {capacities[0]}
