"""Speculative decoding through the engine: the same deltas as plain decoding, cancellation, metrics, configuration."""

from __future__ import annotations

import pytest
import trio

from engine_kit import REPEATING, running_engine, wait_until
from kestrel_trio import EngineLimits, GenerationRequest, KestrelError, SamplingParams
from kestrel_trio.engine import Engine


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model


@pytest.fixture(scope="module")
def draft(other_tiny_model):
    return other_tiny_model  # the same vocabulary, other weights


def _request(model, text=REPEATING, **params):
    fields = {"temperature": 0.0, "max_tokens": 60, **params}
    return GenerationRequest(tuple(model.encode(text)), SamplingParams(**fields))


async def _deltas(engine, request):
    async with engine.open_generation(request) as handle:
        return [delta async for delta in handle]


def _wire(deltas):
    """What a client sees of each delta (everything but timing)."""
    return [(d.token_id, d.text, d.finish_reason, d.completion_tokens, d.prompt_tokens) for d in deltas]


@pytest.mark.parametrize("mode", ["ngram", "draft"])
async def test_streams_with_speculation_equal_plain_streams(model, mode):
    # The model drafts for itself: greedy drafts are right unless the request's penalties change the argmax.
    requests = [_request(model), _request(model, max_tokens=23, stop="lazy"), _request(model, text="hello", ignore_eos=True),
                _request(model, repetition_penalty=1.5, presence_penalty=0.5, ignore_eos=True)]
    with trio.fail_after(60):
        async with running_engine(model, prefix_cache_bytes=0) as engine:
            plain = [await _deltas(engine, r) for r in requests]
        async with running_engine(model, prefix_cache_bytes=0, speculative=mode,
                                  draft_model=model if mode == "draft" else None) as engine:
            fast = [await _deltas(engine, r) for r in requests]
            metrics = engine.metrics
            assert metrics.spec_drafts.value() > 0
            assert 0 < metrics.spec_accepted_tokens.value() < metrics.spec_draft_tokens.value()
            assert metrics.steps.value() < sum(len(d) for d in plain)  # several tokens a step
            assert engine.report()["speculative"]["mode"] == mode
    assert [_wire(d) for d in fast] == [_wire(d) for d in plain]
    assert [d.completion_tokens for d in fast[0]] == list(range(1, len(fast[0]) + 1))


async def test_metrics_export_the_drafted_and_accepted_tokens(model):
    with trio.fail_after(30):
        async with running_engine(model, speculative="ngram") as engine:
            await _deltas(engine, _request(model))
            text = engine.metrics.render()
            drafted = engine.metrics.spec_draft_tokens.value()
            accepted = engine.metrics.spec_accepted_tokens.value()
    exported = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line.startswith("kestrel:spec_decode_")}
    assert drafted > 0
    assert exported["kestrel:spec_decode_num_draft_tokens_total"] == drafted
    assert exported["kestrel:spec_decode_num_accepted_tokens_total"] == accepted
    assert exported["kestrel:spec_decode_num_drafts_total"] >= 1
    assert exported["kestrel:spec_decode_draft_acceptance_rate"] == pytest.approx(accepted / drafted)


async def test_a_consumer_that_leaves_mid_stream_stops_speculation_within_one_step(model):
    with trio.fail_after(30):
        async with running_engine(model, speculative="ngram") as engine:
            request = _request(model, max_tokens=400, ignore_eos=True)
            async with engine.open_generation(request) as handle:
                async for delta in handle:
                    if delta.completion_tokens >= 5:
                        break
            job = handle._job
            assert job.abandoned and not job.done
            await wait_until(lambda: engine.active == 0)
            assert job.steps_after_abandon <= 1 and engine.max_steps_after_abandon <= 1
            assert job.generation.completion_tokens < 400
            assert engine.metrics.cancelled.value(phase="decode") == 1
            after = await _deltas(engine, _request(model, max_tokens=10))  # the engine goes on
            assert len(after) == 10 and after[-1].finish_reason == "length"


async def test_seeded_sampling_steps_aside_and_unseeded_sampling_speculates(model):
    with trio.fail_after(30):
        async with running_engine(model, speculative="ngram") as engine:
            first = await _deltas(engine, _request(model, temperature=0.9, top_k=2, seed=7, ignore_eos=True))
            assert engine.metrics.spec_drafts.value() == 0
            again = await _deltas(engine, _request(model, temperature=0.9, top_k=2, seed=7, ignore_eos=True))
            assert _wire(first) == _wire(again)
            await _deltas(engine, _request(model, temperature=0.9, top_k=2, ignore_eos=True))
            assert engine.metrics.spec_drafts.value() > 0


async def test_a_draft_models_cache_is_reserved_in_the_kv_budget(model, draft):
    with trio.fail_after(30):
        async with running_engine(model, speculative="draft", draft_model=draft) as engine:
            tokens = engine.kv.reservation_tokens(len(model.encode(REPEATING)) + 60)
            expected = tokens * (model.decoder.kv_token_bytes() + draft.decoder.kv_token_bytes())
            async with engine.open_generation(_request(model)) as handle:
                await handle.__anext__()
                assert handle._job.kv_bytes == expected > engine.kv.reservation_bytes(tokens)
                assert engine.kv_usage.reserved_bytes == expected


def test_the_mode_and_the_draft_model_must_agree(model, draft):
    with pytest.raises(KestrelError, match="needs the draft model"):
        Engine(model, EngineLimits(speculative="draft"))
    with pytest.raises(KestrelError, match="not 'draft'"):
        Engine(model, EngineLimits(speculative="ngram"), draft)
    with pytest.raises(ValueError):
        EngineLimits(speculative="medusa")
    with pytest.raises(ValueError):
        EngineLimits(speculative="ngram", speculative_tokens=0)
    assert Engine(model, EngineLimits()).report()["speculative"] == {"mode": "off", "tokens": 0, "draft_model": None}
    assert Engine(model, EngineLimits(speculative="draft", speculative_tokens=3), draft).report()["speculative"] == {
        "mode": "draft", "tokens": 3, "draft_model": draft.name}
