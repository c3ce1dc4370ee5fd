"""Stepping generations together changes no output: each stream equals its solo run at temperature 0."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio

from kestrel_trio import EngineLimits, GenerationRequest, SamplingParams, load_model, run_engine

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"


@pytest.fixture(scope="module")
def model():
    return load_model(FIXTURE)


async def _generate(engine, model, text: str, max_tokens: int) -> list[int]:
    request = GenerationRequest(tuple(model.encode(text)), SamplingParams(temperature=0.0, max_tokens=max_tokens))
    async with engine.open_generation(request) as deltas:
        return [delta.token_id async for delta in deltas]


async def _run_all(model, limits: EngineLimits, prompts: list[tuple[str, int]]) -> list[list[int]]:
    results: list[list[int]] = [[] for _ in prompts]
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(functools.partial(run_engine, model, limits=limits))

        async def one(i: int, text: str, n: int) -> None:
            results[i] = await _generate(engine, model, text, n)

        async with trio.open_nursery() as clients:
            for i, (text, n) in enumerate(prompts):
                clients.start_soon(one, i, text, n)
        nursery.cancel_scope.cancel()
    return results


async def test_batched_streams_equal_their_solo_runs(model):
    prompts = [("hello world, this is a longer prompt that needs several prefill chunks", 20),
               ("你好", 12), ("the quick brown fox", 16), ("a", 25)]
    with trio.fail_after(60):
        solo = [(await _run_all(model, EngineLimits(max_batch=1), [p]))[0] for p in prompts]
        batched = await _run_all(model, EngineLimits(max_batch=4, prefill_chunk=5), prompts)
    assert [len(tokens) for tokens in solo] == [n for _, n in prompts]
    assert batched == solo
