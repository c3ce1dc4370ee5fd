"""The engine's prefix cache: later prompts reuse earlier KV, and identical prompts share one prefill.

Either way the output is unchanged: at temperature 0 each stream equals its run on an engine without the cache.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio

from kestrel_trio import EngineLimits, GenerationRequest, SamplingParams, load_model, run_engine

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"
SYSTEM = "You are a careful assistant who answers in full sentences and checks every step twice. " * 3


@pytest.fixture(scope="module")
def model():
    return load_model(FIXTURE)


def request(model, text: str, max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(tuple(model.encode(text)), SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                       ignore_eos=True))


async def collect(engine, req: GenerationRequest) -> tuple[list[int], int]:
    async with engine.open_generation(req) as deltas:
        got = [delta async for delta in deltas]
    return [d.token_id for d in got], got[-1].cached_tokens


async def solo(model, req: GenerationRequest) -> list[int]:
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(functools.partial(run_engine, model,
                                                       limits=EngineLimits(prefix_cache_bytes=0)))
        tokens, cached = await collect(engine, req)
        nursery.cancel_scope.cancel()
    assert cached == 0
    return tokens


async def test_a_later_prompt_with_the_same_prefix_reuses_its_kv_and_its_output_is_unchanged(model) -> None:
    first, second = request(model, SYSTEM + "Question one?"), request(model, SYSTEM + "Another question entirely?")
    shared = next(i for i, (a, b) in enumerate(zip(first.prompt_ids, second.prompt_ids)) if a != b)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            engine = await nursery.start(functools.partial(run_engine, model, limits=EngineLimits()))
            _, cold = await collect(engine, first)
            tokens, cached = await collect(engine, second)
            nursery.cancel_scope.cancel()
        expected = await solo(model, second)
    assert cold == 0 and cached == shared > 50
    assert tokens == expected
    assert engine.prefix_cache.hits == 1


async def test_identical_concurrent_prompts_share_one_prefill(model) -> None:
    req = request(model, SYSTEM + "Tell me a story.", max_tokens=6)
    with trio.fail_after(60):
        results: list[tuple[list[int], int]] = []
        async with trio.open_nursery() as nursery:
            engine = await nursery.start(functools.partial(run_engine, model,
                                                           limits=EngineLimits(max_batch=4, prefill_chunk=16)))
            async with trio.open_nursery() as clients:
                for _ in range(3):
                    clients.start_soon(lambda: _append(results, collect(engine, req)))
            steps = engine.metrics.steps.value()
            nursery.cancel_scope.cancel()
        expected = await solo(model, req)
    assert [tokens for tokens, _ in results] == [expected] * 3
    assert sorted(cached for _, cached in results) == [0, len(req.prompt_ids) - 1, len(req.prompt_ids) - 1]
    prefill_steps = -(-len(req.prompt_ids) // 16)
    assert steps <= prefill_steps + 1 + 6  # one prefill, then the followers' last token joins a decode step


async def _append(results: list, awaitable) -> None:
    results.append(await awaitable)


async def test_prompts_sharing_a_prefix_while_running_together_each_get_their_own_output(model) -> None:
    first = request(model, SYSTEM + "Question one?")
    second = request(model, SYSTEM + "Another question entirely?", max_tokens=10)
    third = request(model, SYSTEM + "A third, different question?", max_tokens=10)
    with trio.fail_after(60):
        results: dict[str, tuple[list[int], int]] = {}
        async with trio.open_nursery() as nursery:
            engine = await nursery.start(functools.partial(run_engine, model, limits=EngineLimits(max_batch=4)))
            await collect(engine, first)  # its cache is now idle in the prefix cache

            async def run(name: str, req: GenerationRequest) -> None:
                results[name] = await collect(engine, req)

            async with trio.open_nursery() as clients:  # one is handed first's cache, the other copies from it
                clients.start_soon(run, "second", second)
                clients.start_soon(run, "third", third)
            nursery.cancel_scope.cancel()
        expected = {"second": await solo(model, second), "third": await solo(model, third)}
    assert {name: tokens for name, (tokens, _) in results.items()} == expected
    assert all(cached > 50 for _, cached in results.values())
    assert engine.prefix_cache.hits == 2
