"""Speculative steps (sans-IO, synchronous): at temperature 0 the output is plain decoding's, token for token.

A generation is stepped by the engine's own step (``step_generations``) with
and without a drafter; every stream of results (ids, texts, finish reasons,
logprobs) must match, and the KV cache must hold exactly the tokens kept.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine_kit import REPEATING

from kestrel_trio.engine.step.batch import step_generations
from kestrel_trio.text.generation import Generation, Phase
from kestrel_trio.text.sampling import SamplingParams
from kestrel_trio.text.speculative import DraftModelDrafter, NgramDrafter, SpeculationState


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model


@pytest.fixture(scope="module")
def other_model(other_tiny_model):
    return other_tiny_model  # mostly wrong drafts


def _ngram(model, **policy):
    # One-token suffixes too: a tiny random model's text seldom repeats two tokens, and these tests need drafts.
    return SpeculationState(NgramDrafter(min_n=1), 8, **policy)


def _draft(model, draft_model, k=4):
    drafter = DraftModelDrafter(draft_model, draft_model.new_cache(max_tokens=512), prefill_chunk=64,
                                vocab_size=model.tokenizer.vocab_size)
    return SpeculationState(drafter, k)


def _generation(model, text, params, speculation=None):
    tokenizer = model.tokenizer
    return Generation(model.encode(text), params, tokenizer=tokenizer, eos_token_ids=tokenizer.eos_token_ids,
                      cache=model.new_cache(max_tokens=512), vocab_size=model.config.vocab_size, prefill_chunk=16,
                      speculation=speculation)


def _run(model, text, params, speculation=None):
    """Every per-token result of the generation, stepped alone to the end; checks the cache after each step."""
    g = _generation(model, text, params, speculation)
    results = []
    steps = 0
    while g.phase is not Phase.DONE:
        step = step_generations(model, [g])[0]
        steps += 1
        results.extend(r for r in step.tokens() if r.token_id is not None)
        if g.phase is Phase.DECODE:
            assert g.cache.length == g.kv_tokens == g.prompt_tokens + g.completion_tokens - 1
            assert g.cached_token_ids() == (g.prompt_ids + g.generated_ids)[:-1]
    assert [r.token_id for r in results] == g.generated_ids
    return results, steps, g


def _stream(results):
    return [(r.token_id, r.text, r.finish_reason) for r in results]


CASES = [
    (REPEATING, SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)),
    (REPEATING, SamplingParams(temperature=0.0, max_tokens=37)),
    ("hello hello hello world", SamplingParams(temperature=0.0, max_tokens=50, repetition_penalty=1.2,
                                               frequency_penalty=0.3, ignore_eos=True)),
    ("你好，世界。你好", SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)),
]


@pytest.mark.parametrize(("text", "params"), CASES)
def test_ngram_speculation_at_temperature_0_equals_plain_decoding(model, text, params):
    plain, plain_steps, _ = _run(model, text, params)
    fast, fast_steps, g = _run(model, text, params, _ngram(model))
    assert _stream(fast) == _stream(plain)
    assert g.speculation.steps > 0  # it did verify drafts


@pytest.mark.parametrize(("text", "params"), CASES[:2])
def test_a_draft_model_at_temperature_0_equals_plain_decoding(model, other_model, text, params):
    plain, _, _ = _run(model, text, params)
    same, same_steps, g_same = _run(model, text, params, _draft(model, model))
    assert _stream(same) == _stream(plain)
    assert g_same.speculation.accepted == g_same.speculation.drafted  # the model drafting for itself is always right
    assert same_steps < len(plain)
    other, _, g_other = _run(model, text, params, _draft(model, other_model))  # other weights: mostly wrong drafts
    assert _stream(other) == _stream(plain)
    assert 0 < g_other.speculation.steps and g_other.speculation.accepted < g_other.speculation.drafted


def test_a_draft_model_whose_drafts_are_partly_rejected_keeps_its_cache_in_step(model):
    # The model drafts for itself, greedily and without the request's penalties: right only where they do not
    # change the argmax, so verify steps end at a rejection, and its cache must be cut back to the tokens kept.
    params = SamplingParams(temperature=0.0, max_tokens=60, repetition_penalty=1.5, presence_penalty=0.5,
                            ignore_eos=True)
    plain, _, _ = _run(model, REPEATING, params)
    fast, _, g = _run(model, REPEATING, params, _draft(model, model))
    assert _stream(fast) == _stream(plain)
    assert 0 < g.speculation.accepted < g.speculation.drafted
    # The draft cache, cut back after each rejection, still gives the draft model's own next tokens.
    context = g.prompt_ids + g.generated_ids
    expected = model.greedy(context, 3)
    assert _draft_from_scratch(model, context) == expected
    assert g.speculation.drafter.propose(context, 3) == expected  # the cache the run left, after its rejections
    drafter = DraftModelDrafter(model, model.new_cache(max_tokens=512), prefill_chunk=64,
                                vocab_size=model.tokenizer.vocab_size)
    drafter.propose(context[:30], 5)  # a cache part right, part wrong (the draft's 5 tokens are not context's)
    assert drafter.propose(context, 3) == expected


def _draft_from_scratch(model, context):
    drafter = DraftModelDrafter(model, model.new_cache(max_tokens=512), prefill_chunk=64,
                                vocab_size=model.tokenizer.vocab_size)
    return drafter.propose(context, 3)


def test_a_stop_string_inside_an_accepted_run_ends_it_there(model):
    params = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
    plain, _, _ = _run(model, REPEATING, params)
    text = "".join(r.text for r in plain)
    stop = text[len(text) // 2: len(text) // 2 + 3]  # a string the output reaches mid-way
    assert stop.strip()
    stopped = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True, stop=stop)
    plain, _, _ = _run(model, REPEATING, stopped)
    fast, _, g = _run(model, REPEATING, stopped, SpeculationState(_Always(model, REPEATING, 80), 8))
    assert _stream(fast) == _stream(plain)
    assert fast[-1].finish_reason == "stop" and g.speculation.accepted > 0


def test_max_tokens_is_never_exceeded_and_drafts_fit_the_room_left(model):
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    plain, _, _ = _run(model, REPEATING, params)
    fast, steps, g = _run(model, REPEATING, params, SpeculationState(_Always(model, REPEATING, 9), 8))
    assert _stream(fast) == _stream(plain) and len(fast) == 9
    prefill_steps = -(-g.prompt_tokens // 16)  # the last one samples the first token
    assert steps == prefill_steps + 1  # then 8 more in one verify step of 7 drafted tokens
    assert g.speculation.drafted == 7


def test_logprobs_of_a_speculative_run_match_plain_decoding(model):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=3)
    plain, _, _ = _run(model, REPEATING, params)
    fast, _, g = _run(model, REPEATING, params, _ngram(model))
    assert g.speculation.steps > 0
    for a, b in zip(plain, fast, strict=True):
        assert a.logprobs.token_id == b.logprobs.token_id
        assert b.logprobs.logprob == pytest.approx(a.logprobs.logprob, abs=1e-4)
        assert [i for i, _ in b.logprobs.top] == [i for i, _ in a.logprobs.top]


def test_in_a_batch_of_two_nobody_drafts(model):
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    pair = [_generation(model, REPEATING, params, _ngram(model)) for _ in range(2)]
    while any(g.phase is not Phase.DONE for g in pair):
        results = step_generations(model, [g for g in pair if g.phase is not Phase.DONE])
        assert all(not r.before for r in results)
    assert all(g.speculation.steps == 0 for g in pair)
    alone, _, _ = _run(model, REPEATING, params)
    assert pair[0].generated_ids == pair[1].generated_ids == [r.token_id for r in alone]


def test_sampled_tokens_with_speculation_stay_within_each_positions_candidates(model):
    params = SamplingParams(temperature=0.8, top_k=3, max_tokens=60, ignore_eos=True)
    _, _, g = _run(model, REPEATING, params, _ngram(model))
    assert g.speculation.accepted > 0
    rows = model.logits(g.prompt_ids + g.generated_ids)  # [T, vocab]: the row before each token
    for i, token in enumerate(g.generated_ids):
        top3 = np.argsort(-rows[g.prompt_tokens + i - 1])[:3]
        assert token in top3.tolist(), i


class _Always:
    """A drafter that knows plain decoding's answer: every draft is right (to reach stops and limits mid-run)."""

    def __init__(self, model, text, max_tokens):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.prompt = model.encode(text)
        self.answer = _run(model, text, params)[2].generated_ids

    def propose(self, context, k):
        done = len(context) - len(self.prompt)
        return self.answer[done: done + k]

    def release(self):
        pass


def test_a_draft_model_drafts_no_further_than_its_own_context(model):
    drafter = DraftModelDrafter(model, model.new_cache(max_tokens=1024), prefill_chunk=256,
                                vocab_size=model.tokenizer.vocab_size)
    window = model.config.max_position_embeddings  # 512 for the fixture
    context = (model.encode(REPEATING) * window)[: window - 2]
    assert len(context) == window - 2
    assert len(drafter.propose(context, 8)) == 2
    assert drafter.propose(context + [1, 2], 8) == []
