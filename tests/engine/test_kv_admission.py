"""The context cap and the KV budget, one rule at a time, on the tiny fixture (512 KV bytes a token).

Budgets are a few 64-token blocks (32 KiB each), so the rules show with prompts of tens of tokens.
"""

from __future__ import annotations

import pytest
import trio

import kestrel_trio.engine.engine as engine_module
from kestrel_trio.engine import Engine, EngineLimits, GenerationRequest
from kestrel_trio.errors import ContextLengthError, KestrelError, QueueFullError
from kestrel_trio.model import Model
from kestrel_trio.text import SamplingParams

from engine_kit import StepGate, greedy_tokens, running_engine, wait_until

BLOCK = 64  # tokens a reservation is rounded up to
TOKEN_BYTES = 512  # tiny fixture: 2 layers x 2 kv heads x 16 x K and V x 4 bytes


def blocks(n: int) -> int:
    """Bytes of ``n`` KV blocks of the tiny fixture in fp32."""
    return n * BLOCK * TOKEN_BYTES


def request(prompt: list[int], max_tokens: int | None) -> GenerationRequest:
    return GenerationRequest(tuple(prompt), SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))


def prompt_of(length: int, start: int = 10) -> list[int]:
    return [(start + i * 7) % 500 + 5 for i in range(length)]


async def drain(handle) -> list[int]:
    return [delta.token_id async for delta in handle]


async def test_the_budget_and_the_token_bytes_are_reported(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_engine(tiny_model, kv_cache_bytes=blocks(4)) as engine:
            report = engine.memory_report()
    assert engine.kv.token_bytes == TOKEN_BYTES and engine.kv.budget_tokens == 4 * BLOCK
    assert report["max_model_len"] == 512
    assert report["kv_cache"]["budget_bytes"] == blocks(4) and report["kv_cache"]["dtype"] == "fp32"
    assert report["kv_cache"]["reserved_bytes"] == report["kv_cache"]["used_bytes"] == 0


async def test_bf16_kv_holds_twice_the_tokens_in_the_same_budget(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_engine(tiny_model, kv_cache_bytes=blocks(4), kv_dtype="bf16") as engine:
            handle = engine.open_generation(request(prompt_of(20), 400))  # 420 tokens: over 256 in fp32
            tokens = await drain(handle)
    assert engine.kv.budget_tokens == 8 * BLOCK
    assert len(tokens) == 400


async def test_a_request_that_can_never_fit_the_budget_is_refused_at_once(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_engine(tiny_model, kv_cache_bytes=blocks(4)) as engine:
            with pytest.raises(ContextLengthError) as too_many:
                engine.open_generation(request(prompt_of(20), 300))  # 320 tokens > 256
            with pytest.raises(ContextLengthError) as too_long:
                engine.open_generation(request(prompt_of(300), None))
            assert engine.queued == 0 and engine.metrics.steps.value() == 0
    message = too_many.value.message
    assert too_many.value.param == "max_tokens" and too_many.value.code == "context_length_exceeded"
    assert "KV cache budget holds 256 tokens" in message and "needs 320 tokens" in message and "(300)" in message
    assert too_long.value.param == "prompt" and "The prompt is 300 tokens" in too_long.value.message


async def test_without_max_tokens_a_request_gets_what_the_budget_holds(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_engine(tiny_model, kv_cache_bytes=blocks(2)) as engine:
            handle = engine.open_generation(request(prompt_of(20), None))
            job = handle._job
            assert job.generation.params.max_tokens == 2 * BLOCK - 20  # not the context's 492
            assert job.kv_bytes == blocks(2)
            tokens = await drain(handle)
    assert len(tokens) == 2 * BLOCK - 20


async def test_max_model_len_caps_every_context_check(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_engine(tiny_model, max_model_len=64) as engine:
            assert engine.model.context_length == 64 and tiny_model.context_length == 512  # a view, not a change
            with pytest.raises(ContextLengthError) as refused:
                engine.open_generation(request(prompt_of(60), 10))
            with pytest.raises(ContextLengthError):
                engine.model.check_token_ids(prompt_of(65))
            handle = engine.open_generation(request(prompt_of(60), None))
            assert handle._job.generation.params.max_tokens == 4
            assert len(await drain(handle)) == 4
    assert "context cap (max_model_len) of 64 tokens" in refused.value.message


async def test_a_max_model_len_beyond_the_models_context_stops_the_start(tiny_model: Model) -> None:
    with pytest.raises(KestrelError, match="max_model_len 600 exceeds the model's context length of 512"):
        Engine(tiny_model, EngineLimits(max_model_len=600))


async def test_a_request_that_fits_the_budget_but_not_the_room_left_waits_its_turn(
    tiny_model: Model, gate: StepGate, autojump_clock
) -> None:
    # Each needs 20 + 80 tokens = 2 blocks: the whole budget. The second must wait, however long, and then run.
    first_prompt, second_prompt = prompt_of(20), prompt_of(20, start=30)
    async with running_engine(tiny_model, kv_cache_bytes=blocks(2), prefix_cache_bytes=0) as engine:
        with gate.held():
            first = engine.open_generation(request(first_prompt, 80))
            await gate.until_blocked()  # the first one's first step is in flight
            second = engine.open_generation(request(second_prompt, 80))
            gate.allow()
            await gate.until_blocked(2)  # the engine admitted between two steps: not the second one
            await trio.sleep(30)  # virtual seconds: it is still waiting, never refused
            assert (engine.active, engine.queued) == (1, 1)
            usage = engine.kv_usage
            assert usage.reserved_bytes == blocks(2) and usage.waiting_for_kv == 1
            assert engine.metrics.kv_waits.value() == 1
        async with first, second:
            results = [await drain(first), await drain(second)]
    assert results == [greedy_tokens(tiny_model, first_prompt, 80), greedy_tokens(tiny_model, second_prompt, 80)]
    assert engine.metrics.steps.value() == 160  # one after the other, never batched together
    queued_seconds = next(v for name, _, v in engine.metrics.queue_time.samples() if name.endswith("_sum"))
    assert queued_seconds >= 30
    assert engine.kv_usage.waiting_for_kv == 0 and engine.kv_usage.reserved_bytes == 0


async def test_a_request_waiting_for_kv_still_counts_against_the_queue(tiny_model: Model, gate: StepGate) -> None:
    with trio.fail_after(30):
        async with running_engine(tiny_model, kv_cache_bytes=blocks(2), max_queued=1) as engine:
            with gate.held():
                running = engine.open_generation(request(prompt_of(20), 80))
                await gate.until_blocked()
                waiting = engine.open_generation(request(prompt_of(20, 30), 80))
                gate.allow()
                await gate.until_blocked(2)
                assert engine.kv_usage.waiting_for_kv == 1
                with pytest.raises(QueueFullError):  # at once, although the waiting one could run some day
                    engine.open_generation(request(prompt_of(5), 5))
                await waiting.aclose()  # leaving while it waits for KV: dropped, no compute
                assert engine.queued == 0
                gate.release()
            async with running:
                assert len(await drain(running)) == 80
            await wait_until(lambda: engine.active == 0)
    assert waiting._job.steps == 0
    assert engine.metrics.cancelled.value(phase="queued") == 1
    assert engine.kv_usage.waiting_for_kv == 0


async def test_idle_prefix_cache_entries_give_way_to_a_request_that_needs_their_room(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_engine(tiny_model, kv_cache_bytes=blocks(2)) as engine:
            first = await drain(engine.open_generation(request(prompt_of(20), 80)))
            assert len(engine.prefix_cache) == 1 and engine.kv_usage.prefix_bytes == blocks(2)  # kept, idle
            second = await drain(engine.open_generation(request(prompt_of(20, 30), 80)))
    assert len(first) == len(second) == 80
    assert engine.metrics.kv_waits.value() == 0  # evicting the idle entry made the room at once
    assert engine.prefix_cache.hits == 0 and len(engine.prefix_cache) == 1


async def test_a_prefix_reused_within_the_budget_still_answers_as_computed(tiny_model: Model) -> None:
    base = prompt_of(40)
    with trio.fail_after(30):
        async with running_engine(tiny_model, kv_cache_bytes=blocks(3)) as engine:
            await drain(engine.open_generation(request(base, 20)))
            longer = base + prompt_of(10, start=200)
            handle = engine.open_generation(request(longer, 60))  # 110 tokens: reserves 2 blocks
            tokens = await drain(handle)
    assert engine.prefix_cache.hits == 1
    assert tokens == greedy_tokens(tiny_model, longer, 60)


async def test_the_real_kv_bytes_never_exceed_the_budget_nor_a_generation_its_reservation(
    tiny_model: Model, monkeypatch
) -> None:
    budget = blocks(7)
    seen: list[int] = []
    over: list[tuple[int, int]] = []
    real_step = engine_module.step_generations

    def measured_step(decoder, generations, prefix_cache, *args):
        results = real_step(decoder, generations, prefix_cache, *args)
        caches = {id(g.cache): g.cache for g in generations}
        caches.update({id(e.cache): e.cache for e in prefix_cache._entries.values()})
        seen.append(sum(cache.nbytes for cache in caches.values()))
        for g in generations:
            reserved = -(-(g.prompt_tokens + g.params.max_tokens) // BLOCK) * BLOCK * TOKEN_BYTES
            if g.cache.nbytes > reserved:
                over.append((g.cache.nbytes, reserved))
        return results

    monkeypatch.setattr(engine_module, "step_generations", measured_step)
    shared = prompt_of(30)
    prompts = [shared + prompt_of(5 + i, start=100 + 17 * i) for i in range(6)] + [prompt_of(70, 300)]
    wanted = [40 + 25 * i for i in range(len(prompts))]
    prompts.append(prompt_of(30, 50))
    wanted.append(320)  # 350 tokens: a cache growing by quarters would pass 384 on its way to 448
    with trio.fail_after(60):
        async with running_engine(tiny_model, kv_cache_bytes=budget, max_batch=4, prefill_chunk=16) as engine:
            counts: dict[int, int] = {}

            async def one(index: int) -> None:
                counts[index] = len(await drain(engine.open_generation(request(prompts[index], wanted[index]))))

            async with trio.open_nursery() as nursery:
                for index in range(len(prompts)):
                    nursery.start_soon(one, index)
    assert counts == dict(enumerate(wanted))
    assert engine.metrics.kv_waits.value() >= 1  # the budget really was the bound
    assert max(seen) <= budget, max(seen)
    assert not over
