"""The engine alone (no HTTP): deltas, abandonment in each phase, the bounded queue, shutdown."""

from __future__ import annotations

import functools

import pytest
import trio

from kestrel_trio.engine import EngineLimits, GenerationRequest, run_engine
from kestrel_trio.errors import ContextLengthError, EngineUnavailableError, QueueFullError
from kestrel_trio.model import Model
from kestrel_trio.text import SamplingParams

from engine_kit import StepGate, greedy_tokens, running_engine, wait_until

def greedy_request(prompt_ids, max_tokens: int) -> GenerationRequest:
    """A greedy request that generates exactly ``max_tokens`` tokens (EOS ignored)."""
    return GenerationRequest(tuple(prompt_ids), SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))


def prompt_of(model: Model, text: str = "Tell me about the sea.") -> list[int]:
    return model.encode(model.apply_chat_template([{"role": "user", "content": text}]))


async def drain(handle) -> list:
    return [delta async for delta in handle]


async def test_deltas_concatenate_to_the_decoded_tokens(model: Model) -> None:
    prompt = prompt_of(model)
    expected_ids = greedy_tokens(model, prompt, 40)
    with trio.fail_after(30):
        async with running_engine(model) as engine:
            async with engine.open_generation(greedy_request(prompt, 40)) as handle:
                deltas = await drain(handle)
    tokens = [d.token_id for d in deltas]
    assert tokens == expected_ids
    assert "".join(d.text for d in deltas) == model.decode(tokens)
    assert [d.completion_tokens for d in deltas] == list(range(1, 41))
    assert {d.prompt_tokens for d in deltas} == {len(prompt)}
    assert [d.finish_reason for d in deltas] == [None] * 39 + ["length"]
    assert handle.finished


async def test_batched_generations_match_solo_ones(tiny_model: Model) -> None:
    prompts = [prompt_of(tiny_model, text) for text in ("Hi", "A much longer question about rivers and seas?")]
    with trio.fail_after(30):
        async with running_engine(tiny_model, max_batch=2, prefill_chunk=5) as engine:
            results: dict[int, list] = {}

            async def consume(index: int) -> None:
                async with engine.open_generation(greedy_request(prompts[index], 16)) as handle:
                    results[index] = await drain(handle)

            async with trio.open_nursery() as nursery:
                for index in range(2):
                    nursery.start_soon(consume, index)
    for index, prompt in enumerate(prompts):
        assert [d.token_id for d in results[index]] == greedy_tokens(tiny_model, prompt, 16)


async def test_a_consumer_that_leaves_mid_decode_costs_at_most_one_more_step(tiny_model: Model) -> None:
    prompt = prompt_of(tiny_model)
    long_run = 512 - len(prompt) - 1
    with trio.fail_after(30):
        async with running_engine(tiny_model) as engine:
            async with engine.open_generation(greedy_request(prompt, long_run)) as handle:
                async for delta in handle:
                    if delta.completion_tokens == 3:
                        break
            job = handle._job
            assert job.abandoned and not job.done
            await wait_until(lambda: engine.active == 0)
            assert engine.max_steps_after_abandon <= 1
            assert job.steps_after_abandon <= 1
            assert job.steps < long_run
            assert engine.metrics.cancelled.value(phase="decode") == 1
            assert engine.metrics.finished.value(finished_reason="length") == 0

            steps_before = engine.metrics.steps.value()
            async with engine.open_generation(greedy_request(prompt, 5)) as handle:
                deltas = await drain(handle)
            assert [d.token_id for d in deltas] == greedy_tokens(tiny_model, prompt, 5)
            assert engine.metrics.steps.value() == steps_before + 5


async def test_a_generation_abandoned_while_queued_runs_no_step(tiny_model: Model, gate: StepGate) -> None:
    prompt = prompt_of(tiny_model)
    with trio.fail_after(30):
        async with running_engine(tiny_model, max_batch=1) as engine:
            with gate.held():
                first = engine.open_generation(greedy_request(prompt, 4))
                await gate.until_blocked()  # the first job's first step is in flight
                second = engine.open_generation(greedy_request(prompt, 4))
                assert (engine.active, engine.queued) == (1, 1)
                await second.aclose()
                assert engine.queued == 0
            async with first:
                deltas = await drain(first)
            await wait_until(lambda: engine.active == 0)
    assert len(deltas) == 4
    assert first._job.steps == 4
    assert engine.metrics.steps.value() == 4  # the first job's steps only
    assert second._job.steps == 0
    assert engine.metrics.cancelled.value(phase="queued") == 1
    assert engine.max_steps_after_abandon == 0


async def test_a_generation_abandoned_during_prefill_stops_within_one_step(tiny_model: Model, gate: StepGate) -> None:
    prompt = prompt_of(tiny_model, "word " * 30)
    assert len(prompt) > 10 * 4  # at least ten prefill chunks of 4
    with trio.fail_after(30):
        async with running_engine(tiny_model, prefill_chunk=4) as engine:
            with gate.held(after=1):
                handle = engine.open_generation(greedy_request(prompt, 8))
                await gate.until_blocked()  # the first prefill chunk is done, the second in flight
                job = handle._job
                assert (job.steps, job.phase) == (1, "prefill")
                handle.cancel()
            await wait_until(lambda: engine.active == 0)
    assert engine.metrics.cancelled.value(phase="prefill") == 1
    assert job.steps == 2 and job.steps_after_abandon == 1
    assert engine.max_steps_after_abandon == 1
    assert engine.metrics.steps.value() == 2
    assert engine.metrics.generation_tokens.value() == 0


async def test_a_full_queue_refuses_at_once(tiny_model: Model, gate: StepGate) -> None:
    prompt = prompt_of(tiny_model)
    with trio.fail_after(30):
        async with running_engine(tiny_model, max_queued=1, max_batch=1) as engine:
            with gate.held():
                active = engine.open_generation(greedy_request(prompt, 3))
                await gate.until_blocked()
                queued = engine.open_generation(greedy_request(prompt, 3))
                # open_generation is synchronous: the refusal comes without any wait.
                with pytest.raises(QueueFullError) as refusal:
                    engine.open_generation(greedy_request(prompt, 3))
                gate.allow()
                await gate.until_blocked(2)  # one step later the queued job waits in the engine, off the channel
                assert (engine.active, engine.queued) == (1, 1)
                with pytest.raises(QueueFullError):
                    engine.open_generation(greedy_request(prompt, 3))
                await queued.aclose()
                replacement = engine.open_generation(greedy_request(prompt, 3))  # the abandoned job's room is free
                assert engine.metrics.steps.value() == 1
            async with active, replacement:
                results = [await drain(active), await drain(replacement)]
    assert refusal.value.retry_after >= 1
    assert refusal.value.status == 429
    assert engine.metrics.rejected.value(reason="queue_full") == 2
    assert [len(deltas) for deltas in results] == [3, 3]
    assert queued._job.steps == 0


async def test_a_prompt_that_does_not_fit_is_refused_at_once(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_engine(tiny_model) as engine:
            with pytest.raises(ContextLengthError) as too_long:
                engine.open_generation(GenerationRequest(tuple([7] * 512), SamplingParams(), prompt_param="messages"))
            with pytest.raises(ContextLengthError) as too_many:
                engine.open_generation(greedy_request([7] * 500, 20))
            assert engine.queued == 0
    assert too_long.value.param == "messages"
    assert too_many.value.param == "max_tokens"


async def test_a_stopped_engine_is_unavailable(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_engine(tiny_model) as engine:
            assert engine.status == "ok"
    assert engine.status == "stopped"
    with pytest.raises(EngineUnavailableError):
        engine.open_generation(greedy_request(prompt_of(tiny_model), 2))
    assert engine.metrics.rejected.value(reason="unavailable") == 1


async def test_every_accepted_job_ends_when_the_engine_is_cancelled(tiny_model: Model, gate: StepGate) -> None:
    prompt = prompt_of(tiny_model)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            engine = await nursery.start(functools.partial(run_engine, tiny_model, limits=EngineLimits(max_batch=1)))
            with gate.held(after=2):
                active = engine.open_generation(greedy_request(prompt, 50))
                await gate.until_blocked()  # two steps done, the third in flight
                queued = engine.open_generation(greedy_request(prompt, 50))
                assert (engine.active, engine.queued) == (1, 1)
                nursery.cancel_scope.cancel()  # the engine stops once the held step returns
        assert engine.status == "stopped"
        outcomes = [await deltas_until_error(handle) for handle in (active, queued)]
    (active_deltas, active_error), (queued_deltas, queued_error) = outcomes
    assert 2 <= len(active_deltas) <= 3
    assert all(d.finish_reason is None for d in active_deltas)
    assert queued_deltas == []
    assert isinstance(active_error, EngineUnavailableError) and isinstance(queued_error, EngineUnavailableError)
    assert active.finished and queued.finished
    assert queued._job.steps == 0
    assert engine.metrics.failed.value() == 2


async def deltas_until_error(handle) -> tuple[list, Exception | None]:
    """The deltas a handle yields, and the error that ended its iteration (None if it ended normally)."""
    deltas = []
    try:
        async for delta in handle:
            deltas.append(delta)
    except Exception as exc:
        return deltas, exc
    return deltas, None


async def test_a_job_abandoned_while_queued_frees_its_slot_before_the_next_step(
    tiny_model: Model, gate: StepGate
) -> None:
    # Regression: the abandoned job still sat in the bounded channel until the next step boundary,
    # so a new request got 429 although /health said nothing was queued.
    request = greedy_request(prompt_of(tiny_model), 4)
    with trio.fail_after(30), gate.held():
        async with running_engine(tiny_model, max_queued=1, max_batch=1) as engine:
            running = engine.open_generation(request)
            await gate.until_blocked()
            engine.open_generation(request).cancel()
            assert engine.queued == 0
            replacement = engine.open_generation(request)  # must not raise QueueFullError
            assert engine.queued == 1
            with pytest.raises(QueueFullError):
                engine.open_generation(request)
            running.cancel()
            replacement.cancel()
            gate.release()  # let the held step finish before the engine is cancelled
