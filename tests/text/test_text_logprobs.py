"""Logprobs: the distribution after logit_bias and penalties, before temperature; per-step results of a Generation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kestrel_trio.errors import BadRequestError
from kestrel_trio.model import load_model
from kestrel_trio.text.generation import Generation
from kestrel_trio.text.sampling import Sampler, SamplingParams
from kestrel_trio.text.sampling.sampler import token_logprobs

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def test_token_logprobs_is_the_log_softmax_with_ordered_alternatives():
    logits = np.random.default_rng(3).normal(size=50).astype(np.float32)
    logits[7] = logits[9] = logits.max() + 1  # a tie at the top: lower id first
    scored = token_logprobs(logits, 21, 4)
    expected = log_softmax(logits)
    assert scored.token_id == 21
    assert scored.logprob == pytest.approx(expected[21], abs=1e-9)
    assert [i for i, _ in scored.top] == [7, 9, *np.argsort(-expected)[2:4].tolist()]
    assert [lp for _, lp in scored.top] == pytest.approx(expected[[i for i, _ in scored.top]].tolist(), abs=1e-9)
    assert token_logprobs(logits, 0, 0).top == ()


def test_padding_rows_at_minus_infinity_are_never_alternatives():
    logits = np.array([0.0, 1.0, -np.inf, -np.inf], dtype=np.float32)
    scored = token_logprobs(logits, 1, 2)
    assert [i for i, _ in scored.top] == [1, 0]
    assert np.isfinite(scored.logprob)


@pytest.mark.parametrize("temperature", [0.0, 0.3, 1.7])
def test_reported_logprobs_ignore_temperature_but_include_bias(temperature):
    logits = np.random.default_rng(5).normal(size=64).astype(np.float32)
    plain = Sampler(SamplingParams(temperature=temperature, logprobs=3, seed=1), 64)
    token, scored = plain.sample_scored(logits, [], [])
    assert scored.logprob == pytest.approx(log_softmax(logits)[token], abs=1e-6)
    biased = Sampler(SamplingParams(temperature=temperature, logprobs=3, seed=1, logit_bias={11: 100}), 64)
    token, scored = biased.sample_scored(logits, [], [])
    assert token == 11 and scored.logprob > -1e-3 and scored.top[0][0] == 11


def test_scored_sampling_draws_the_same_tokens_as_plain_sampling():
    logits = np.random.default_rng(8).normal(size=64).astype(np.float32)
    quiet = Sampler(SamplingParams(seed=42), 64)
    scored = Sampler(SamplingParams(seed=42, logprobs=2), 64)
    drawn = [quiet.sample(logits, [], []) for _ in range(20)]
    assert drawn == [scored.sample_scored(logits, [], [])[0] for _ in range(20)]
    assert quiet.sample_scored(logits, [], [])[1] is None


def test_logprobs_field_is_bounded():
    with pytest.raises(BadRequestError) as info:
        SamplingParams(logprobs=21)
    assert info.value.param == "logprobs"


def test_a_generation_reports_each_token_but_not_the_eos_that_ended_it():
    model = load_model(FIXTURE)
    tokenizer = model.require_tokenizer()
    eos = next(iter(tokenizer.eos_token_ids))
    prompt = model.encode("hello there")
    # Two greedy steps, then EOS is made the winner on the third.
    params = SamplingParams(temperature=0, logprobs=2, max_tokens=5)
    generation = Generation(prompt, params, tokenizer=tokenizer, eos_token_ids=frozenset({eos}),
                            cache=model.new_cache(), vocab_size=model.config.vocab_size)
    results = []
    while generation.finish_reason is None:
        logits = model.logits(prompt + generation.generated_ids)[-1]  # [vocab], no cache: driven directly
        if len(generation.generated_ids) == 2:
            logits = logits.copy()
            logits[eos] = logits.max() + 50
        results.append(generation.advance(logits))
    assert [r.finish_reason for r in results][-1] == "stop"
    assert [r.logprobs is not None for r in results] == [True, True, False]
    first = results[0].logprobs
    assert first.token_id == results[0].token_id
    assert first.top[0][0] == first.token_id  # greedy picks the most likely token
    assert len(first.top) == 2
