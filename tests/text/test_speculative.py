"""Speculative decoding's sans-IO parts: the n-gram drafter, the acceptance rule, the pause policy.

The acceptance rule is checked statistically: with fixed seeds and enough
draws, the tokens it emits follow the target distribution p (a chi-square
test), and the same test rejects a deliberately wrong rule, so it can fail.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel_trio.model import load_model
from kestrel_trio.text.sampling import Sampler, SamplingParams
from kestrel_trio.text.sampling.sampler import apply_penalties, candidate_probabilities
from kestrel_trio.text.speculative import (
    NgramDrafter, SpeculationState, accept_or_resample, steps_aside,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"
CHI2_CRITICAL_0_001 = {4: 18.467, 5: 20.515, 7: 24.322, 9: 27.877}  # chi-square quantiles at p = 0.999, by df


# ---- the n-gram drafter (prompt lookup) ----

def test_ngram_proposes_what_followed_the_longest_matching_suffix():
    drafter = NgramDrafter(max_n=3)
    #          0  1  2  3  4  5  6  7  8  9
    context = [1, 2, 3, 4, 5, 9, 3, 4, 7, 2, 3]
    # Suffix [2, 3] occurred at 1..2 (then 4, 5, 9); the 1-gram [3] most recently at 6 (then 4, 7): the longer wins.
    assert drafter.propose(context, 3) == [4, 5, 9]


def test_ngram_prefers_the_most_recent_occurrence_and_respects_k():
    drafter = NgramDrafter(max_n=2)
    context = [5, 6, 1, 5, 6, 2, 8, 5, 6]
    assert drafter.propose(context, 2) == [2, 8]
    assert drafter.propose(context, 0) == []


def test_ngram_proposes_nothing_without_a_match_and_min_n_bounds_the_suffix():
    assert NgramDrafter().propose([1, 2, 3, 4], 4) == []
    assert NgramDrafter(max_n=3, min_n=2).propose([1, 2, 9, 1], 4) == []  # only the 1-gram [1] matched
    assert NgramDrafter(max_n=3, min_n=1).propose([1, 2, 9, 1], 4) == [2, 9, 1]
    with pytest.raises(ValueError):
        NgramDrafter(max_n=1, min_n=2)


def _reference_propose(context: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Brute force: for n from max_n down, the latest earlier occurrence of the n-token suffix."""
    end = len(context)
    for n in range(min(max_n, end - 1), min_n - 1, -1):
        suffix = context[end - n:]
        for stop in range(end - 1, n - 1, -1):
            if context[stop - n:stop] == suffix:
                return context[stop:stop + k]
    return []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 5), st.integers(1, 3))
def test_ngram_growing_index_matches_a_brute_force_search_at_every_length(tokens, k, max_n):
    drafter = NgramDrafter(max_n=max_n, min_n=1)
    for end in range(1, len(tokens) + 1):
        assert drafter.propose(tokens[:end], k) == _reference_propose(tokens[:end], k, max_n, 1)


# ---- the acceptance rule (speculative sampling) ----

def _chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    expected = counts.sum() * p
    return float(((counts - expected) ** 2 / expected).sum())


def _draws(rule, p: np.ndarray, q: np.ndarray, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros(p.size)
    for draft in rng.choice(p.size, size=n, p=q):
        counts[rule(p, q, int(draft), rng)] += 1
    return counts


def _wrong_rule(p, q, draft, rng):
    """Accepts as speculative sampling does, but on rejection draws from p itself, not from max(0, p - q)."""
    if rng.random() * q[draft] < p[draft]:
        return draft
    return int(rng.choice(p.size, p=p))


P = np.array([0.05, 0.4, 0.25, 0.2, 0.1])
Q = np.array([0.3, 0.1, 0.1, 0.3, 0.2])


def test_rejection_sampling_with_a_drafter_distribution_emits_the_target_distribution():
    counts = _draws(accept_or_resample, P, Q, 40_000, seed=11)
    assert _chi_square(counts, P) < CHI2_CRITICAL_0_001[4]


def test_rejection_sampling_with_a_point_mass_draft_emits_the_target_distribution():
    for draft in range(P.size):
        q = np.eye(P.size)[draft]
        counts = _draws(accept_or_resample, P, q, 20_000, seed=20 + draft)
        assert _chi_square(counts, P) < CHI2_CRITICAL_0_001[4], draft


def test_the_chi_square_check_detects_a_wrong_acceptance_rule():
    counts = _draws(_wrong_rule, P, Q, 40_000, seed=11)
    assert _chi_square(counts, P) > 10 * CHI2_CRITICAL_0_001[4]


def test_a_draft_with_p_zero_is_always_rejected_and_never_emitted():
    p = np.array([0.0, 0.5, 0.5])
    rng = np.random.default_rng(0)
    assert all(accept_or_resample(p, np.eye(3)[0], 0, rng) != 0 for _ in range(200))


@pytest.fixture(scope="module")
def fixture_logits() -> np.ndarray:
    """Real next-token logits [vocab] of the tiny fixture model."""
    model = load_model(FIXTURE)
    return model.logits(model.encode("the quick brown fox"))[-1]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=6),
    SamplingParams(temperature=0.7, top_k=10, top_p=0.8, repetition_penalty=1.3),
])
def test_sample_draft_on_fixture_logits_follows_the_distribution_plain_sampling_draws_from(fixture_logits, params):
    generated, prompt = [3, 7], [1, 2, 3]
    ids, p = candidate_probabilities(apply_penalties(fixture_logits, params, generated, prompt), params)
    assert 5 <= ids.size <= 10
    draft = int(ids[np.argsort(-p)[1]])  # the second most likely candidate: accepted only sometimes
    sampler = Sampler(attrs.evolve(params, seed=5), fixture_logits.size)
    counts = dict.fromkeys(ids.tolist(), 0)
    for _ in range(30_000):
        token, _ = sampler.sample_draft(fixture_logits, generated, prompt, draft)
        counts[token] += 1
    observed = np.array([counts[i] for i in ids.tolist()], dtype=np.float64)
    assert _chi_square(observed, p) < CHI2_CRITICAL_0_001[ids.size - 1]


def test_sample_draft_at_temperature_0_is_the_argmax_draft_or_not(fixture_logits):
    sampler = Sampler(SamplingParams(temperature=0.0), fixture_logits.size)
    best = int(np.argmax(fixture_logits))
    assert sampler.sample_draft(fixture_logits, [], [], best)[0] == best
    assert sampler.sample_draft(fixture_logits, [], [], (best + 1) % fixture_logits.size)[0] == best


# ---- the policy ----

class _Fixed:
    def __init__(self, draft):
        self.draft = draft

    def propose(self, context, k):
        return self.draft[:k]

    def release(self):
        pass


def test_drafting_pauses_when_a_window_of_verify_steps_accepts_too_little_and_pauses_double():
    state = SpeculationState(_Fixed([1, 2, 3, 4]), tokens=4, window=4, min_accepted=1.0, pause=3)
    for _ in range(4):
        assert state.propose([0], room=10) == [1, 2, 3, 4]
        state.record(drafted=4, accepted=0)
    assert state.paused and state.propose([0], room=10) == []
    for _ in range(3):
        state.plain_step()
    assert not state.paused
    for _ in range(4):
        state.record(drafted=4, accepted=0)
    assert state.pauses == 2
    for _ in range(5):
        state.plain_step()
    assert state.paused  # the second pause lasts 6 tokens
    state.plain_step()
    assert not state.paused


def test_drafting_that_pays_never_pauses_and_counts_are_reported_once():
    state = SpeculationState(_Fixed([1, 2, 3]), tokens=3, window=2, min_accepted=1.0)
    for _ in range(10):
        state.record(drafted=3, accepted=1)
    assert not state.paused and state.pauses == 0
    assert state.take_counts() == (30, 10, 10)
    assert state.take_counts() == (0, 0, 0)
    assert (state.drafted, state.accepted, state.steps) == (30, 10, 10)


def test_the_draft_is_cut_to_k_and_to_the_room_left():
    state = SpeculationState(_Fixed(list(range(10))), tokens=5)
    assert state.propose([0], room=10) == [0, 1, 2, 3, 4]
    assert state.propose([0], room=2) == [0, 1]
    assert state.propose([0], room=0) == []


def test_what_steps_aside():
    greedy = SamplingParams(temperature=0.0, seed=3)
    assert steps_aside(greedy, constrained=False, images=False) is None  # greedy ignores the seed
    assert steps_aside(SamplingParams(temperature=0.8), constrained=False, images=False) is None
    assert steps_aside(SamplingParams(temperature=0.8, seed=1), constrained=False, images=False) == "seeded sampling"
    assert steps_aside(greedy, constrained=True, images=False) == "grammar"
    assert steps_aside(greedy, constrained=False, images=True) == "images"
