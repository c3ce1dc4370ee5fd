"""The repetition guard (sans-IO): a looping output ends with finish_reason "length"; ordinary text goes on."""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio._model import KVCache
from kestrel_trio.errors import BadRequestError
from kestrel_trio.text import Tokenizer
from kestrel_trio.text.generation import Generation
from kestrel_trio.text.repetition import RepetitionGuard, RepetitionWatch
from kestrel_trio.text.sampling import SamplingDefaults, SamplingParams


def first_trip(guard: RepetitionGuard, tokens: list[int]) -> int | None:
    """How many tokens the watch took when it first said "looping", or None."""
    watch = RepetitionWatch(guard)
    for count, token in enumerate(tokens, 1):
        if watch.push(token):
            return count
    return None


def brute_force_trip(guard: RepetitionGuard, tokens: list[int]) -> int | None:
    """The same, by the definition: the last window tokens are periodic with a period of at most window // repeats."""
    for end in range(guard.window, len(tokens) + 1):
        tail = tokens[end - guard.window:end]
        for p in range(1, guard.longest_cycle + 1):
            if all(tail[i] == tail[i - p] for i in range(p, len(tail))):
                return end
    return None


def test_a_line_repeated_ends_once_the_window_holds_the_repeats() -> None:
    line = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]  # a 10-token line: "A canvas of numbers,\n"
    tokens = [1, 2, 3, 4, 5] + line * 20
    guard = RepetitionGuard(window=40, repeats=4)
    # The window fills with copies 5 tokens in, and must span 40 tokens of them.
    assert first_trip(guard, tokens) == 5 + 40


def test_a_cycle_longer_than_window_over_repeats_is_not_caught() -> None:
    stanza = list(range(100, 130))  # 30 tokens
    assert first_trip(RepetitionGuard(window=64, repeats=4), stanza * 10) is None  # at most 16-token cycles
    assert first_trip(RepetitionGuard(window=120, repeats=4), stanza * 10) == 120


def test_short_runs_of_ordinary_text_do_not_trip_it() -> None:
    guard = RepetitionGuard(window=32, repeats=4)
    ha = [7, 8] * 6  # "ha ha ha ..." twelve tokens
    table = [5] * 20  # a run of dashes
    assert first_trip(guard, [1, 2, 3] + ha + [4, 5] + table + [6, 9, 10]) is None
    assert first_trip(guard, [5] * 32) == 32  # a run as long as the window is a loop


@pytest.mark.parametrize("seed", range(20))
def test_the_incremental_watch_agrees_with_the_definition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    guard = RepetitionGuard(window=int(rng.integers(2, 40)), repeats=int(rng.integers(2, 6)))
    if guard.repeats > guard.window:
        guard = RepetitionGuard(window=guard.window, repeats=2)
    # Random text with loops spliced in: few distinct tokens, so near-misses are common.
    tokens: list[int] = []
    while len(tokens) < 400:
        if rng.random() < 0.3:
            cycle = rng.integers(0, 4, size=int(rng.integers(1, 12))).tolist()
            tokens += cycle * int(rng.integers(1, 8))
        else:
            tokens += rng.integers(0, 4, size=int(rng.integers(1, 10))).tolist()
    assert first_trip(guard, tokens) == brute_force_trip(guard, tokens)


@pytest.mark.parametrize(("window", "repeats", "param"), [
    (1, 2, "repetition_guard.window"), (5000, 4, "repetition_guard.window"), (8, 1, "repetition_guard.repeats"),
    (8, 9, "repetition_guard.repeats"), (8.0, 2, "repetition_guard.window"), (8, True, "repetition_guard.repeats"),
])
def test_out_of_range_guards_are_refused_naming_the_part(window, repeats, param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        RepetitionGuard(window, repeats)
    assert info.value.param == param


def test_the_guard_parses_and_prints_as_window_colon_repeats() -> None:
    assert RepetitionGuard.parse("128:4") == RepetitionGuard(128, 4)
    assert RepetitionGuard.parse(" 64:2 ").describe() == "64:2"
    for text in ("128", "128:x", "a:b", "128:4:2"):
        with pytest.raises(BadRequestError, match="WINDOW:REPEATS"):
            RepetitionGuard.parse(text)


def _generate(tokenizer: Tokenizer, script: list[int], params: SamplingParams) -> tuple[list[int], str, str]:
    """Drive a Generation whose "model" picks the tokens of ``script`` in turn (greedy over one-hot logits)."""
    vocab = tokenizer.vocab_size
    generation = Generation([1, 2, 3], params, tokenizer=tokenizer, eos_token_ids=frozenset(),
                            cache=KVCache(1, 1, 1), vocab_size=vocab, prefill_chunk=8)
    text = []
    while generation.finish_reason is None:
        logits = np.zeros(vocab, dtype=np.float32)  # [vocab]
        logits[script[len(generation.generated_ids)]] = 10.0
        text.append(generation.advance(logits).text)
    return generation.generated_ids, generation.finish_reason, "".join(text)


def test_a_generation_with_the_guard_ends_a_loop_with_length(qwen_tokenizer: Tokenizer) -> None:
    line = qwen_tokenizer.encode("A canvas of numbers,\n")
    script = qwen_tokenizer.encode("Seven is a number.\n") + line * 50
    guard = RepetitionGuard(window=4 * len(line), repeats=4)
    plain = _generate(qwen_tokenizer, script, SamplingParams(temperature=0, max_tokens=len(script)))
    guarded = _generate(qwen_tokenizer, script, SamplingParams(temperature=0, max_tokens=len(script),
                                                               repetition_guard=guard))
    assert plain[1] == "length" and len(plain[0]) == len(script)  # without the guard: to max_tokens
    head = len(script) - 50 * len(line)
    assert guarded[1] == "length" and len(guarded[0]) == head + 4 * len(line)
    assert guarded[2] == "Seven is a number.\n" + "A canvas of numbers,\n" * 4  # the text so far, all of it


def test_server_defaults_sit_between_the_request_and_the_model() -> None:
    model = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    server = SamplingDefaults(temperature=0.2, min_p=0.05, repetition_guard=RepetitionGuard(64, 4))
    params = SamplingParams.with_defaults({"temperature": 0.9}, model, server)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.9, 0.95, 20, 0.05)
    assert params.repetition_guard == RepetitionGuard(64, 4)
    # The server's temperature wins over a checkpoint's do_sample: false.
    assert SamplingParams.with_defaults({}, {"do_sample": False}, server).temperature == 0.2
    assert SamplingParams.with_defaults({}, {"do_sample": False}).temperature == 0.0


@pytest.mark.parametrize(("field", "value"), [("temperature", 2.5), ("top_p", 0.0), ("top_k", -2), ("min_p", 1.5),
                                              ("repetition_penalty", 0.0)])
def test_server_defaults_are_held_to_the_request_ranges(field: str, value: float) -> None:
    with pytest.raises(BadRequestError) as info:
        SamplingDefaults(**{field: value})
    assert info.value.param == field
