"""KV cache storage (fp32, bf16, fp16), its reservation cap, and bf16/fp16 KV accuracy on every fixture."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kestrel_trio._model.cache.kv_cache as kv_cache_module
import kestrel_trio._model.cache.kv_storage as kv_storage
from kestrel_trio import load_model
from kestrel_trio._model.cache.kv_cache import KVCache, KVCacheFull, kv_token_bytes
from kestrel_trio._model.decoder.layers import _attend
from kestrel_trio._model.cache.prefix_cache import PrefixCache
from kestrel_trio._model.checkpoints.safetensors import bf16_to_fp32, fp32_to_bf16_bits

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "golden.npz").exists())
NEAR_TIE = 0.1  # logits: fp32's top-2 margin below this is a near-tie that rounding may legitimately flip
COMPARED_TOKENS = 32


def test_token_bytes_halve_with_bf16_and_fp16():
    shape = (28, 8, 128)  # Qwen3-0.6B: layers, kv heads, head_dim
    assert kv_token_bytes(*shape, "fp32") == 224 * 1024  # the 224 KiB a token
    assert kv_token_bytes(*shape, "bf16") == kv_token_bytes(*shape, "fp16") == 112 * 1024
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        kv_token_bytes(*shape, "int8")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_written_values_are_rounded_once_and_attention_reads_them_exactly(dtype):
    rng = np.random.default_rng(0)
    cache = KVCache(1, 2, 8, dtype=dtype)
    k = rng.standard_normal((5, 2, 8), dtype=np.float32) * 10  # [T, n_kv, head_dim]
    v = rng.standard_normal((5, 2, 8), dtype=np.float32)
    cache.reserve(5)
    keys, values = cache.write(0, k, v)
    if dtype == "bf16":
        assert keys.dtype == np.uint16
        np.testing.assert_array_equal(keys, fp32_to_bf16_bits(k.transpose(1, 0, 2)).reshape(2, 5, 8))
    else:
        assert keys.dtype == np.float16
        np.testing.assert_array_equal(keys, k.transpose(1, 0, 2).astype(np.float16))


def test_fp16_storage_clips_instead_of_overflowing():
    cache = KVCache(1, 1, 4, dtype="fp16")
    cache.reserve(1)
    big = np.full((1, 1, 4), 1e6, dtype=np.float32)  # [T, n_kv, head_dim]
    keys, _ = cache.write(0, big, -big)
    assert np.isfinite(keys.astype(np.float32)).all() and float(keys.max()) == 65504.0


def _widened(stored: np.ndarray) -> np.ndarray:
    if stored.dtype == np.uint16:
        return bf16_to_fp32(stored.reshape(-1)).reshape(stored.shape)
    return stored.astype(np.float32)


@pytest.mark.parametrize("dtype", [np.uint16, np.float16])
@pytest.mark.parametrize(("t", "total"), [(1, 1), (1, 37), (1, 300), (6, 6), (7, 301)])
def test_chunked_attention_over_stored_kv_equals_the_float32_path(monkeypatch, dtype, t, total):
    monkeypatch.setattr(kv_storage, "CHUNK_ELEMENTS", 2 * 16 * 40)  # 40-token chunks: several, a ragged last one
    rng = np.random.default_rng(t * 1000 + total)
    h, group, d = 2, 3, 16
    grouped = rng.standard_normal((h, t * group, d), dtype=np.float32)  # [h, T*group, head_dim]
    raw = rng.standard_normal((2, h, total, d), dtype=np.float32)  # keys, values
    if dtype == np.uint16:
        keys, values = (fp32_to_bf16_bits(x).reshape(x.shape) for x in raw)
    else:
        keys, values = raw.astype(np.float16)
    diagonal = None  # the T queries are the last T keys: each hides the keys after it
    if t > 1:
        diagonal = np.where(np.arange(t)[None, :] > np.arange(t)[:, None], np.float32(-np.inf), np.float32(0))
    expected = np.empty((h, t * group, d), dtype=np.float32)
    _attend(grouped, _widened(keys), _widened(values), diagonal, expected)
    got = np.empty_like(expected)
    _attend(grouped, keys, values, diagonal, got)  # stored dtype: the chunked path
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_capped_cache_grows_with_its_tokens_and_never_past_its_reservation():
    # Not allocated at the whole reservation up front: numpy's huge pages would make all of it resident
    # as soon as each head's first tokens are written (kv_cache.py).
    cache = KVCache(2, 2, 4, block_tokens=16, max_tokens=100)
    per_token = cache.token_bytes
    cache.reserve(3)
    assert cache.capacity == 16 and cache.nbytes == 16 * per_token  # one block, not the 100-token reservation
    rng = np.random.default_rng(1)
    written = []
    for _ in range(100):  # fill it one token at a time: it grows in blocks, never past the reservation
        cache.reserve(1)
        kv = rng.standard_normal((1, 2, 4), dtype=np.float32)
        for layer in range(2):
            cache.write(layer, kv, kv)
        cache.commit(1)
        written.append(kv[0])  # [n_kv, head_dim]
        assert cache.capacity <= 100 and cache.nbytes <= 100 * per_token
        assert cache.capacity - cache.length <= cache.length // 4 + 16  # room: a quarter and a block at most
    assert cache.capacity == 100
    np.testing.assert_array_equal(cache.keys[1][:, :100], np.stack(written, axis=1))  # nothing lost on growth
    with pytest.raises(KVCacheFull, match="reservation of 100"):
        cache.reserve(1)


def test_shrink_to_fit_keeps_the_tokens_in_whole_blocks():
    cache = KVCache(2, 1, 4, block_tokens=16, max_tokens=512)
    cache.reserve(200)
    data = np.arange(20 * 4, dtype=np.float32).reshape(20, 1, 4)
    for layer in range(2):
        cache.write(layer, data, -data)
    cache.commit(20)
    cache.shrink_to_fit()
    assert cache.capacity == 32 and cache.nbytes == 32 * cache.token_bytes
    keys, values = cache.stored(1, 0)
    np.testing.assert_array_equal(keys, data.transpose(1, 0, 2))
    np.testing.assert_array_equal(values, -data.transpose(1, 0, 2))
    cache.reserve(100)  # and grows again as a request reuses it
    assert cache.capacity >= 120 and cache.length == 20


def test_an_uncapped_cache_still_grows_by_a_quarter_in_blocks():
    cache = KVCache(1, 1, 4, block_tokens=16)
    cache.reserve(10)
    assert cache.capacity == 16
    cache.commit(16)
    cache.reserve(1)
    assert cache.capacity == 32  # max(17, 16 + 4) rounded up to a block


def test_a_growth_refused_part_way_resumes_without_losing_tokens(monkeypatch):
    cache = KVCache(3, 1, 4, block_tokens=8)
    cache.reserve(8)
    for layer in range(3):
        cache.write(layer, np.full((8, 1, 4), layer, np.float32), np.full((8, 1, 4), -layer, np.float32))
    cache.commit(8)
    real_empty, calls = np.empty, []

    def failing_empty(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # keys of every layer grown, then the values' first allocation is refused
            raise MemoryError("refused")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(kv_cache_module.np, "empty", failing_empty)
    with pytest.raises(MemoryError):
        cache.reserve(1)
    monkeypatch.setattr(kv_cache_module.np, "empty", real_empty)
    cache.reserve(1)
    assert cache.capacity == 16 and all(a.shape[1] == 16 for a in cache.keys + cache.values)
    for layer in range(3):
        assert (cache.keys[layer][:, :8] == layer).all() and (cache.values[layer][:, :8] == -layer).all()


def test_handing_over_an_idle_entry_respects_the_new_requests_reservation():
    prefix = PrefixCache(2**30, min_tokens=4)
    ids = list(range(20))
    big = KVCache(1, 1, 4, block_tokens=16, max_tokens=64)
    big.reserve(50)
    for layer in range(1):
        big.write(layer, np.ones((20, 1, 4), np.float32), np.ones((20, 1, 4), np.float32))
    big.commit(20)
    prefix.store(ids, big, in_use=True)  # kept at the end of its prefill,
    prefix.release(big)  # then abandoned: idle at its 64-token capacity
    small = KVCache(1, 1, 4, block_tokens=16, max_tokens=32)
    cache, restored = prefix.reuse(ids + [99], small)
    assert cache is small and restored == 20  # 64-token capacity > 32-token reservation: copied, not handed over
    assert small.nbytes == 32 * small.token_bytes
    roomy = KVCache(1, 1, 4, block_tokens=16, max_tokens=128)
    cache, restored = prefix.reuse(ids + [98], roomy)
    assert cache is big and cache.max_tokens == 128 and restored == 20  # handed over, now capped by its new owner
    assert prefix.idle_bytes == 0  # in use by that request: its memory now, not the prefix cache's


def test_idle_entries_are_evicted_oldest_first_down_to_a_byte_bound():
    prefix = PrefixCache(2**30, min_tokens=2)
    caches = []
    for start in range(3):
        cache = KVCache(1, 1, 4, block_tokens=16)
        cache.reserve(4)
        cache.commit(4)
        prefix.store([start * 10 + i for i in range(4)], cache)
        caches.append(cache)
    per_entry = caches[0].nbytes
    assert prefix.idle_bytes == 3 * per_entry
    assert prefix.evict_idle(per_entry) == 2 * per_entry and len(prefix) == 1
    assert prefix.restore([20, 21, 22, 23, 9], KVCache(1, 1, 4)) == 4  # the newest one is the one kept


def _teacher_forced(model, prompt: list[int], dtype: str, tokens: list[int] | None) -> tuple[list[int], list[float]]:
    """Greedy argmax and top-2 margin at each of COMPARED_TOKENS steps; fed ``tokens`` when given, else its own."""
    cache = model.new_cache(dtype)
    logits = model.prefill(cache, prompt)
    picks, margins = [], []
    for i in range(COMPARED_TOKENS):
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        picks.append(int(np.argmax(logits)))
        logits = model.step(cache, [picks[-1] if tokens is None else tokens[i]])
    return picks, margins


@pytest.fixture(scope="module", params=NAMES)
def fixture_model(request):
    folder = FIXTURES / request.param
    return load_model(folder), np.load(folder / "golden.npz")["prompt_ids"].tolist()


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_kv_picks_fp32_kvs_greedy_tokens_wherever_fp32_is_not_a_near_tie(fixture_model, dtype):
    model, prompt = fixture_model
    reference, margins = _teacher_forced(model, prompt, "fp32", None)
    picks, _ = _teacher_forced(model, prompt, dtype, reference)  # the same tokens fed: no divergence compounds
    decisive = [i for i, margin in enumerate(margins) if margin >= NEAR_TIE]
    assert len(decisive) >= 16, f"only {len(decisive)} decisive steps: the fixture cannot show agreement"
    assert [picks[i] for i in decisive] == [reference[i] for i in decisive]

