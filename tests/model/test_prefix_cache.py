"""The prefix cache: exact reuse of prompt KV, LRU within a byte budget (synchronous)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kestrel_trio import load_model
from kestrel_trio._model.cache.kv_cache import KVCache
from kestrel_trio._model.cache.prefix_cache import PrefixCache, common_prefix_length

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_fp32"


@pytest.fixture(scope="module")
def model():
    return load_model(FIXTURE)


def prompt(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 500, size=length).tolist()


def filled_cache(model, ids: list[int]) -> KVCache:
    cache = model.new_cache()
    model.step(cache, ids)
    return cache


def test_a_restored_prefix_gives_the_logits_of_a_full_prefill(model) -> None:
    shared = prompt(0, 30)
    prefix_cache = PrefixCache(2**30)
    prefix_cache.store(shared + prompt(1, 10), filled_cache(model, shared + prompt(1, 10)))
    new_prompt = shared + prompt(2, 12)
    cache = model.new_cache()
    restored = prefix_cache.restore(new_prompt, cache)
    assert restored == 30 and cache.length == 30
    logits = model.step(cache, new_prompt[restored:])  # [1, vocab]: last row only
    expected = model.step(model.new_cache(), new_prompt)  # [1, vocab]
    np.testing.assert_allclose(logits, expected, rtol=0, atol=2e-5)
    assert (prefix_cache.hits, prefix_cache.misses, prefix_cache.reused_tokens) == (1, 0, 30)


def test_the_last_prompt_token_is_always_recomputed(model) -> None:
    ids = prompt(3, 20)
    prefix_cache = PrefixCache(2**30)
    prefix_cache.store(ids, filled_cache(model, ids))
    assert prefix_cache.restore(ids, model.new_cache()) == 19
    assert prefix_cache.restore(ids[:12], model.new_cache()) == 11


def test_short_prefixes_a_disabled_cache_and_a_used_cache_restore_nothing(model) -> None:
    ids = prompt(4, 20)
    prefix_cache = PrefixCache(2**30, min_tokens=8)
    prefix_cache.store(ids, filled_cache(model, ids))
    assert prefix_cache.restore(ids[:5] + prompt(5, 10), model.new_cache()) == 0
    assert prefix_cache.restore(ids, filled_cache(model, ids[:3])) == 0  # only empty caches are filled
    disabled = PrefixCache(0)
    disabled.store(ids, filled_cache(model, ids))
    assert len(disabled) == 0 and disabled.restore(ids, model.new_cache()) == 0
    assert prefix_cache.misses == 1


def test_eviction_is_least_recently_used_within_the_budget() -> None:
    def cache_of(length: int) -> KVCache:
        cache = KVCache(num_layers=1, num_kv_heads=1, head_dim=4, block_tokens=16)
        cache.reserve(length)
        cache.commit(length)
        return cache

    one = cache_of(10).nbytes
    prefix_cache = PrefixCache(2 * one, min_tokens=2)
    a, b, c = ([k] * 10 for k in (1, 2, 3))
    prefix_cache.store(a, cache_of(10))
    prefix_cache.store(b, cache_of(10))
    assert prefix_cache.restore(a + [9], KVCache(1, 1, 4)) == 10  # a is now the most recent
    prefix_cache.store(c, cache_of(10))  # over budget: b, the least recent, goes
    assert len(prefix_cache) == 2 and prefix_cache.nbytes <= 2 * one
    assert prefix_cache.restore(b + [9], KVCache(1, 1, 4)) == 0
    assert prefix_cache.restore(c + [9], KVCache(1, 1, 4)) == 10


def test_a_longer_entry_supersedes_its_prefix_and_the_same_cache_is_kept_once(model) -> None:
    ids = prompt(6, 24)
    prefix_cache = PrefixCache(2**30)
    cache = filled_cache(model, ids)
    prefix_cache.store(ids[:12], cache)
    prefix_cache.store(ids, cache)
    assert len(prefix_cache) == 1
    other = filled_cache(model, ids[:16])
    prefix_cache.store(ids[:16], other)  # not a superset of the 24-token entry: both kept
    assert len(prefix_cache) == 2
    with pytest.raises(ValueError, match="holds 16 tokens"):
        prefix_cache.store(ids, other)


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_common_prefix_length_matches_a_plain_loop(a: list[int], b: list[int]) -> None:
    expected = 0
    while expected < min(len(a), len(b)) and a[expected] == b[expected]:
        expected += 1
    assert common_prefix_length(np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)) == expected


def test_an_idle_entry_is_handed_over_and_one_in_use_is_copied(model) -> None:
    shared = prompt(20, 30)
    first = shared + prompt(21, 10)
    prefix_cache = PrefixCache(2**30)
    stored = filled_cache(model, first)
    prefix_cache.store(first, stored)  # a finished request's cache: idle
    second = shared + prompt(22, 6)
    own = model.new_cache()
    cache, restored = prefix_cache.reuse(second, own)
    assert cache is stored and restored == 30 and cache.length == 30  # no copy: the entry is cut to the prefix
    assert own.length == 0 and own.capacity == 0  # the new request's own cache was not even allocated
    third = shared + prompt(23, 4)
    copy, copied = prefix_cache.reuse(third, model.new_cache())  # the entry is now in use by `second`
    assert copy is not stored and copied == 30 and copy.capacity >= len(third)
    for logits_of, ids, cache_used, done in ((1, second, cache, restored), (2, third, copy, copied)):
        logits = model.step(cache_used, ids[done:])  # [1, vocab]
        np.testing.assert_allclose(logits, model.step(model.new_cache(), ids), rtol=0, atol=2e-5)
    prefix_cache.store(second, cache)  # `second` finished: idle again, with its own tokens
    again, handed = prefix_cache.reuse(second + prompt(24, 3), model.new_cache())
    assert again is stored and handed == len(second)


def test_an_entry_released_by_its_request_can_be_handed_over(model) -> None:
    ids = prompt(25, 24)
    prefix_cache = PrefixCache(2**30)
    live = filled_cache(model, ids)
    prefix_cache.store(ids, live, in_use=True)  # stored at the end of a prefill: the request goes on
    copy, _ = prefix_cache.reuse(ids + [1], model.new_cache())
    assert copy is not live
    prefix_cache.release(live)  # that request was abandoned
    handed, restored = prefix_cache.reuse(ids + [1], model.new_cache())
    assert handed is live and restored == 24


def test_truncate_keeps_storage_and_never_grows() -> None:
    cache = KVCache(1, 1, 4)
    cache.reserve(10)
    cache.commit(10)
    cache.truncate(4)
    assert (cache.length, cache.capacity) == (4, 64)
    cache.truncate(5)
    assert cache.length == 4


def test_a_finished_requests_entry_keeps_its_tokens_not_its_reservation(model) -> None:
    ids = prompt(11, 40)
    cache = model.new_cache(max_tokens=4096)  # a chat without max_tokens reserves the whole context
    cache.reserve(1000)  # room a longer answer would have used
    model.step(cache, ids)
    prefix_cache = PrefixCache(2**30, min_tokens=8)
    prefix_cache.store(ids, cache)
    assert cache.capacity == 64 and prefix_cache.nbytes == 64 * cache.token_bytes  # 40 tokens in one block
    reused = model.new_cache(max_tokens=4096)
    handed, restored = prefix_cache.reuse(ids + [7], reused)
    assert handed is cache and restored == 40


def test_an_abandoned_requests_entry_is_shrunk_once_the_engine_is_idle(model) -> None:
    ids = prompt(12, 30)
    live = model.new_cache(max_tokens=4096)
    live.reserve(2000)
    model.step(live, ids)
    prefix_cache = PrefixCache(2**30, min_tokens=8)
    prefix_cache.store(ids, live, in_use=True)  # stored at the end of its prefill
    model.step(live, prompt(13, 5))  # it decoded on, then its client left
    prefix_cache.release(live)
    assert prefix_cache.idle_bytes == live.capacity * live.token_bytes >= 2000 * live.token_bytes
    freed = prefix_cache.shrink_idle()
    assert live.capacity == 64 and live.length == 30  # its entry's tokens: the 5 decoded ones had no ids kept
    assert freed == (2048 - 64) * live.token_bytes and prefix_cache.idle_bytes == 64 * live.token_bytes
    fresh = model.new_cache()
    _, restored = prefix_cache.reuse(ids + [3], fresh)
    assert restored == 30
