"""SamplingParams validation and defaults; Sampler order, determinism and support."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kestrel_trio.errors import BadRequestError
from kestrel_trio.text import Sampler, SamplingParams
from kestrel_trio.text.sampling.sampler import apply_penalties, candidate_probabilities

# A small hand-made distribution: softmax(LOGITS) == PROBS.
PROBS = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
LOGITS = np.log(PROBS).astype(np.float32)
DRAWS = 6000


def draw_counts(params: SamplingParams, logits: np.ndarray = LOGITS, draws: int = DRAWS) -> np.ndarray:
    sampler = Sampler(params, vocab_size=logits.size)
    counts = np.zeros(logits.size, dtype=np.int64)
    for _ in range(draws):
        counts[sampler.sample(logits, [], [])] += 1
    return counts


def assert_frequencies(counts: np.ndarray, expected: np.ndarray) -> None:
    """Observed support equals the expected one and frequencies are within 5 sigma."""
    n = counts.sum()
    np.testing.assert_array_equal(counts > 0, expected > 0)
    sigma = np.sqrt(n * expected * (1 - expected)) + 1e-9
    assert np.all(np.abs(counts - n * expected) <= 5 * sigma), (counts / n, expected)


def renormalised(mask: list[bool], probs: np.ndarray = PROBS) -> np.ndarray:
    kept = np.where(mask, probs, 0.0)
    return kept / kept.sum()


# --- SamplingParams -----------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", 2.01),
        ("temperature", math.nan),
        ("temperature", "hot"),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("top_k", 2.5),
        ("top_k", True),
        ("min_p", -0.01),
        ("min_p", 1.01),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.5),
        ("logit_bias", {5: 101.0}),
        ("logit_bias", {5: -100.5}),
        ("logit_bias", {"five": 1.0}),
        ("logit_bias", {-1: 1.0}),
        ("max_tokens", 0),
        ("max_tokens", 1.5),
        ("seed", "42"),
        ("stop", ("",)),
        ("stop_token_ids", (-1,)),
        ("ignore_eos", "yes"),
    ],
)
def test_validation_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(BadRequestError) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field
    assert info.value.status == 400


def test_valid_edges_are_accepted() -> None:
    params = SamplingParams(
        temperature=0, top_k=-1, top_p=1, min_p=1, repetition_penalty=0.5, presence_penalty=-2,
        frequency_penalty=2, logit_bias={"7": 100, 8: -100}, seed=0, max_tokens=1, stop="###", stop_token_ids=[3],
    )
    assert params.logit_bias == {7: 100, 8: -100}
    assert params.stop == ("###",)
    assert params.stop_token_ids == (3,)
    assert SamplingParams().top_k == 0


QWEN3_GENERATION = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}


def test_defaults_come_from_request_then_checkpoint_then_library() -> None:
    params = SamplingParams.with_defaults({"temperature": 0.2, "top_p": None, "stop": ["x"]}, QWEN3_GENERATION)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.2, 0.95, 20, 0.0)
    assert params.stop == ("x",)
    library = SamplingParams.with_defaults({}, {})
    assert library == SamplingParams(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0)


def test_checkpoint_without_sampling_means_greedy() -> None:
    assert SamplingParams.with_defaults({}, {"do_sample": False, "temperature": 0.7}).temperature == 0.0
    assert SamplingParams.with_defaults({"temperature": 0.7}, {"do_sample": False}).temperature == 0.7


def test_with_defaults_rejects_unknown_fields_and_bad_values() -> None:
    with pytest.raises(TypeError, match="n_best"):
        SamplingParams.with_defaults({"n_best": 2}, {})
    with pytest.raises(BadRequestError) as info:
        SamplingParams.with_defaults({"top_p": 0}, QWEN3_GENERATION)
    assert info.value.param == "top_p"


def test_logit_bias_outside_the_vocabulary() -> None:
    with pytest.raises(BadRequestError) as info:
        Sampler(SamplingParams(logit_bias={6: 1.0}), vocab_size=6)
    assert info.value.param == "logit_bias"


# --- logits processing (exact) ----------------------------------------------


def test_logit_bias_is_added() -> None:
    logits = np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)
    out = apply_penalties(logits, SamplingParams(logit_bias={1: 5.0, 3: -100.0}), [], [])
    np.testing.assert_array_equal(out, np.array([1.0, 3.0, 0.5, -97.0], dtype=np.float32))
    assert logits[1] == -2.0  # the input is not modified


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    logits = np.array([2.0, -2.0, 3.0, -1.0, 0.0, 4.0], dtype=np.float32)
    out = apply_penalties(logits, SamplingParams(repetition_penalty=2.0), generated_ids=[1, 1, 4], prompt_ids=[0, 3])
    np.testing.assert_array_equal(out, np.array([1.0, -4.0, 3.0, -2.0, 0.0, 4.0], dtype=np.float32))


def test_presence_and_frequency_penalties_count_generated_ids_only() -> None:
    logits = np.zeros(5, dtype=np.float32)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, params, generated_ids=[2, 2, 2, 4], prompt_ids=[0, 1, 1])
    np.testing.assert_allclose(out, [0.0, 0.0, -(0.5 + 3 * 0.25), 0.0, -(0.5 + 0.25)], rtol=1e-6)


def test_bias_comes_before_repetition_penalty() -> None:
    # bias first: (1 + 1) / 2 = 1; the other order would give 1 / 2 + 1 = 1.5
    params = SamplingParams(logit_bias={0: 1.0}, repetition_penalty=2.0)
    out = apply_penalties(np.array([1.0, 0.0], dtype=np.float32), params, [0], [])
    assert out[0] == pytest.approx(1.0)


def test_neutral_params_leave_logits_alone() -> None:
    logits = np.array([1.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(apply_penalties(logits, SamplingParams(), [0, 1, 1], [1]), logits)


def test_candidates_exact_support() -> None:
    ids, probs = candidate_probabilities(LOGITS, SamplingParams(top_k=3))
    np.testing.assert_array_equal(ids, [0, 1, 2])
    np.testing.assert_allclose(probs, PROBS[:3] / PROBS[:3].sum(), rtol=1e-6)
    ids, _ = candidate_probabilities(LOGITS, SamplingParams(top_p=0.7))
    np.testing.assert_array_equal(ids, [0, 1, 2])  # 0.40 + 0.25 < 0.7 <= 0.40 + 0.25 + 0.15
    ids, _ = candidate_probabilities(LOGITS, SamplingParams(min_p=0.3))
    np.testing.assert_array_equal(ids, [0, 1, 2])  # 0.15 >= 0.3 * 0.4 > 0.10
    ids, _ = candidate_probabilities(LOGITS, SamplingParams(top_p=1e-9))
    np.testing.assert_array_equal(ids, [0])  # always at least one token


def test_top_k_keeps_ties_with_the_kth() -> None:
    logits = np.array([1.0, 3.0, 2.0, 2.0, 0.0], dtype=np.float32)
    ids, _ = candidate_probabilities(logits, SamplingParams(top_k=2))
    np.testing.assert_array_equal(ids, [1, 2, 3])


# --- sampling (statistical and deterministic) ---------------------------------


def test_plain_sampling_follows_the_softmax() -> None:
    assert_frequencies(draw_counts(SamplingParams(seed=1)), PROBS)


def test_top_k_restricts_the_support() -> None:
    assert_frequencies(draw_counts(SamplingParams(top_k=3, seed=2)), renormalised([True] * 3 + [False] * 3))


def test_top_p_restricts_the_support() -> None:
    # 0.40 + 0.25 + 0.15 = 0.80 is the smallest mass reaching 0.75
    assert_frequencies(draw_counts(SamplingParams(top_p=0.75, seed=3)), renormalised([True] * 3 + [False] * 3))
    assert_frequencies(draw_counts(SamplingParams(top_p=0.85, seed=4)), renormalised([True] * 4 + [False] * 2))


def test_min_p_restricts_the_support() -> None:
    # min_p 0.4 -> threshold 0.16: tokens 0 and 1; min_p 0.2 -> 0.08: tokens 0-3
    assert_frequencies(draw_counts(SamplingParams(min_p=0.4, seed=5)), renormalised([True] * 2 + [False] * 4))
    assert_frequencies(draw_counts(SamplingParams(min_p=0.2, seed=6)), renormalised([True] * 4 + [False] * 2))


@pytest.mark.parametrize("temperature", [0.5, 1.5])
def test_temperature_sharpens_or_flattens(temperature: float) -> None:
    expected = PROBS ** (1 / temperature)
    expected /= expected.sum()
    counts = draw_counts(SamplingParams(temperature=temperature, seed=7))
    assert_frequencies(counts, expected)
    top_share = counts[0] / counts.sum()
    assert (top_share > 0.5) if temperature < 1 else (top_share < 0.33)


def test_temperature_is_applied_before_top_p() -> None:
    # At temperature 0.5 the top token alone has 0.16 / 0.2526 > 0.6 of the mass.
    counts = draw_counts(SamplingParams(temperature=0.5, top_p=0.6, seed=8), draws=500)
    assert_frequencies(counts, renormalised([True] + [False] * 5))


def test_temperature_zero_is_argmax_with_ties_to_the_lowest_id() -> None:
    logits = np.array([0.0, 5.0, 1.0, 5.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=0.0), vocab_size=4)
    assert {sampler.sample(logits, [], []) for _ in range(50)} == {1}


def test_top_k_one_equals_greedy() -> None:
    rng = np.random.default_rng(0)
    greedy = Sampler(SamplingParams(temperature=0.0), vocab_size=1000)
    top1 = Sampler(SamplingParams(top_k=1, temperature=1.3, seed=None), vocab_size=1000)
    for _ in range(50):
        logits = rng.normal(size=1000).astype(np.float32)
        assert top1.sample(logits, [], []) == greedy.sample(logits, [], []) == int(np.argmax(logits))


def test_same_seed_same_tokens_and_different_seed_differs() -> None:
    rng = np.random.default_rng(1)
    steps = [rng.normal(size=500).astype(np.float32) for _ in range(64)]

    def run(seed: int) -> list[int]:
        sampler = Sampler(SamplingParams(seed=seed, top_p=0.9, temperature=1.2), vocab_size=500)
        generated: list[int] = []
        for logits in steps:
            generated.append(sampler.sample(logits, generated, [1, 2, 3]))
        return generated

    assert run(42) == run(42)
    assert run(42) != run(43)
    assert run(-1) == run(-1) != run(42)  # OpenAI allows negative seeds


def test_penalties_steer_the_draw() -> None:
    # Token 0 dominates until its repetition is penalised below token 1.
    logits = np.array([2.0, 1.5, -5.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=0.0, frequency_penalty=1.0), vocab_size=3)
    assert sampler.sample(logits, [], []) == 0
    assert sampler.sample(logits, [0], []) == 1


def test_wrong_logits_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        Sampler(SamplingParams(), vocab_size=6).sample(np.zeros(7, dtype=np.float32), [], [])


def test_full_vocabulary_samples_valid_ids_reproducibly() -> None:
    vocab = 151_936
    logits = np.random.default_rng(3).normal(scale=3.0, size=vocab).astype(np.float32)
    prompt = list(range(0, 4000, 3))
    for params in [SamplingParams(seed=1), SamplingParams(seed=1, top_k=20, top_p=0.95, min_p=0.05, repetition_penalty=1.1),
                   SamplingParams(seed=1, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.5)]:
        runs = []
        for _ in range(2):
            sampler = Sampler(params, vocab)
            generated: list[int] = []
            for _ in range(20):
                generated.append(sampler.sample(logits, generated, prompt))
            runs.append(generated)
        assert runs[0] == runs[1]
        assert all(0 <= t < vocab for t in runs[0])
