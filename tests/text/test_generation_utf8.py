"""A generation cut by max_tokens never ends inside a UTF-8 character (sans-IO, the real Qwen3 tokenizer).

Qwen3's byte-level vocabulary has one token per byte: an emoji spelt as its
four byte tokens is split across four steps, so a max_tokens cut can fall
after its first, second or third byte.
"""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio._model import KVCache
from kestrel_trio.text import SamplingParams, Tokenizer
from kestrel_trio.text.generation import Generation

VOCAB = 151936  # Qwen3's logits rows
EMOJI = "😀"  # 4 bytes: F0 9F 98 80


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_demo()


def byte_token(tokenizer: Tokenizer, value: int) -> int:
    return next(i for i in range(256) if tokenizer.token_bytes(i) == bytes([value]))


def script(tokenizer: Tokenizer) -> list[int]:
    """ "Hello there! " as the tokenizer spells it, then the emoji one byte token at a time, then the end token."""
    return ([*tokenizer.encode("Hello there! "), *(byte_token(tokenizer, b) for b in EMOJI.encode())]
            + [min(tokenizer.eos_token_ids)])


def run(tokenizer: Tokenizer, tokens: list[int], max_tokens: int) -> tuple[list[str], str]:
    """Greedy steps that pick ``tokens`` in order: every streamed delta and the finish reason."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    gen = Generation([1, 2, 3], params, tokenizer=tokenizer, eos_token_ids=tokenizer.eos_token_ids,
                     cache=KVCache(1, 1, 1), vocab_size=VOCAB)
    deltas = []
    while gen.finish_reason is None:
        logits = np.zeros(VOCAB, dtype=np.float32)  # [vocab]
        logits[tokens[len(gen.generated_ids)]] = 10.0
        deltas.append(gen.advance(logits).text)
    return deltas, gen.finish_reason


@pytest.mark.parametrize("emoji_bytes", [1, 2, 3])
def test_a_max_tokens_cut_inside_an_emoji_drops_its_bytes(tokenizer, emoji_bytes):
    tokens = script(tokenizer)
    prefix = len(tokens) - 5
    deltas, reason = run(tokenizer, tokens, prefix + emoji_bytes)
    assert reason == "length"
    assert "".join(deltas) == "Hello there! "  # not "Hello there! \ufffd"
    assert all("\ufffd" not in delta for delta in deltas)


def test_a_cut_right_after_the_emoji_keeps_it_whole(tokenizer):
    tokens = script(tokenizer)
    deltas, reason = run(tokenizer, tokens, len(tokens) - 1)
    assert (reason, "".join(deltas)) == ("length", "Hello there! " + EMOJI)
    assert deltas[-1] == EMOJI  # held until its last byte, then sent at once


def test_an_end_token_after_half_an_emoji_still_shows_the_invalid_bytes(tokenizer):
    # The model ended the text itself: its bytes are invalid UTF-8, as the full decode says (U+FFFD).
    tokens = script(tokenizer)
    tokens = tokens[:-5] + tokens[-5:-3] + tokens[-1:]
    deltas, reason = run(tokenizer, tokens, 100)
    assert (reason, "".join(deltas)) == ("stop", "Hello there! \ufffd")
    assert "".join(deltas) == tokenizer.decode(tokens)
