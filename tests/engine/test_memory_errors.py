"""A MemoryError inside a model step fails only the generations that needed the memory; the engine serves on.

The refusals are injected where the operating system's would come from (the
attention scores of a long context, the sampling arrays of one generation);
tests/reliability/test_address_space_limit.py has the real one, under an
address-space limit, on a real server.
"""

from __future__ import annotations

import importlib

import pytest
import trio

from kestrel_trio.engine import GenerationRequest
from kestrel_trio.errors import OutOfMemoryError
from kestrel_trio.model import Model
from kestrel_trio.text import SamplingParams
from kestrel_trio.text.sampling import Sampler

from engine_kit import greedy_tokens, running_engine

# the package re-exports a function of that name
forward_module = importlib.import_module("kestrel_trio._model.decoder.forward")
chunk_attention_module = importlib.import_module("kestrel_trio._model.decoder.chunk_attention")  # one sequence's chunks
LONG_CONTEXT = 200  # keys beyond this many tokens "cannot be allocated" in these tests


def request(prompt: list[int], max_tokens: int, seed: int | None = None) -> GenerationRequest:
    return GenerationRequest(tuple(prompt), SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                                           seed=seed))


def prompt_of(length: int, start: int = 10) -> list[int]:
    return [(start + i * 7) % 500 + 5 for i in range(length)]


async def outcome(engine, req: GenerationRequest) -> tuple[list[int], Exception | None]:
    tokens: list[int] = []
    try:
        async with engine.open_generation(req) as handle:
            async for delta in handle:
                tokens.append(delta.token_id)
    except Exception as exc:  # the error the engine ended it with
        return tokens, exc
    return tokens, None


async def run_together(engine, requests: list[GenerationRequest]) -> list[tuple[list[int], Exception | None]]:
    results: list = [None] * len(requests)

    async def one(index: int) -> None:
        results[index] = await outcome(engine, requests[index])

    async with trio.open_nursery() as nursery:
        for index in range(len(requests)):
            nursery.start_soon(one, index)
    return results


async def test_a_long_prompt_whose_step_cannot_get_memory_fails_alone(tiny_model: Model, monkeypatch) -> None:
    short = [prompt_of(20), prompt_of(25, start=40)]
    expected = [greedy_tokens(tiny_model, p, 60) for p in short]
    real_attention = forward_module.causal_attention

    def refusing_attention(q, keys, values, past, scale):
        if keys.shape[1] > LONG_CONTEXT:
            raise MemoryError("the scores of a long context")
        return real_attention(q, keys, values, past, scale)

    for module in (forward_module, chunk_attention_module):  # batched rows, and one sequence's chunks
        monkeypatch.setattr(module, "causal_attention", refusing_attention)
    with trio.fail_after(60):
        async with running_engine(tiny_model, max_batch=3, prefill_chunk=64) as engine:
            results = await run_together(engine, [request(short[0], 60), request(prompt_of(300, 70), 10),
                                                  request(short[1], 60)])
            assert engine.status == "ok"
            after = await outcome(engine, request(short[0], 5))  # the engine serves on
    (first, first_error), (long_tokens, long_error), (second, second_error) = results
    assert (first, first_error) == (expected[0], None) and (second, second_error) == (expected[1], None)
    assert long_tokens == [] and isinstance(long_error, OutOfMemoryError)
    assert long_error.status == 503 and long_error.code == "out_of_memory"
    assert "ran out of memory" in long_error.message and "300 prompt tokens" in long_error.message
    assert after == (expected[0][:5], None)
    assert engine.metrics.out_of_memory.value() == 1 and engine.metrics.failed.value() == 1
    assert engine.kv_usage.reserved_bytes == 0


@pytest.mark.parametrize("refusals", [1, 1000])
async def test_sampling_that_runs_out_of_memory_is_retried_alone_or_fails_alone(
    tiny_model: Model, monkeypatch, refusals: int
) -> None:
    prompts = [prompt_of(20), prompt_of(22, start=90), prompt_of(24, start=170)]
    expected = [greedy_tokens(tiny_model, p, 30) for p in prompts]
    real_sample = Sampler.sample_scored
    refused = []

    def sample_scored(self, logits, generated_ids, prompt_ids):
        if self.params.seed == 7 and len(generated_ids) == 10 and len(refused) < refusals:
            refused.append(1)
            raise MemoryError("sampling arrays")
        return real_sample(self, logits, generated_ids, prompt_ids)

    monkeypatch.setattr(Sampler, "sample_scored", sample_scored)
    with trio.fail_after(60):
        async with running_engine(tiny_model, max_batch=3) as engine:
            results = await run_together(engine, [request(prompts[0], 30), request(prompts[1], 30, seed=7),
                                                  request(prompts[2], 30)])
    assert results[0] == (expected[0], None) and results[2] == (expected[2], None)
    middle_tokens, middle_error = results[1]
    if refusals == 1:  # undone, stepped again alone: the same greedy tokens, as if nothing had happened
        assert (middle_tokens, middle_error) == (expected[1], None)
        assert engine.metrics.out_of_memory.value() == 0
    else:
        assert middle_tokens == expected[1][:10] and isinstance(middle_error, OutOfMemoryError)
        assert engine.metrics.out_of_memory.value() == 1


@pytest.mark.parametrize("contain", [False, True])
def test_a_generation_undoes_a_sampling_step_that_ran_out_of_memory_only_when_its_driver_asks(
    tiny_model: Model, monkeypatch, contain: bool
) -> None:
    from kestrel_trio.text.generation import Generation, Phase

    tokenizer = tiny_model.require_tokenizer()
    g = Generation(prompt_of(8), SamplingParams(temperature=0, max_tokens=4), tokenizer=tokenizer,
                   eos_token_ids=tokenizer.eos_token_ids, cache=tiny_model.new_cache(),
                   vocab_size=tiny_model.config.vocab_size, contain_memory_errors=contain)
    logits = tiny_model.prefill(g.cache, g.next_input())

    def refuse(self, *args):
        raise MemoryError("sampling arrays")

    monkeypatch.setattr(Sampler, "sample_scored", refuse)
    if not contain:  # the CLI's own loop: the error is the caller's, as before
        with pytest.raises(MemoryError):
            g.advance(logits)
        return
    assert g.advance(logits).token_id is None
    assert (g.phase, g.kv_tokens, g.memory_failure, g.completion_tokens) == (Phase.PREFILL, 0, "retry", 0)
    assert g.next_input().tolist() == prompt_of(8)  # the same prompt chunk again, once the cache is cut back
