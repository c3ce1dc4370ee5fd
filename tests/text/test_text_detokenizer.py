"""IncrementalDetokenizer: streamed deltas add up to the full decode, never splitting a character."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel_trio.text import IncrementalDetokenizer, Tokenizer

REPLACEMENT = "\ufffd"
VOCAB = 151_669
PADDED_VOCAB = 151_936


def stream(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool = True) -> list[str]:
    """All deltas of a streamed decode, the flush last."""
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    return [detok.push(i) for i in ids] + [detok.flush()]


def check_stream(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool) -> None:
    deltas = stream(tokenizer, ids, skip_special_tokens)
    full = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    assert "".join(deltas) == full
    offset = 0
    for delta in deltas:
        assert not any(0xD800 <= ord(ch) <= 0xDFFF for ch in delta)
        # Every delta is final text: it is exactly the full decode at that position,
        # so a U+FFFD is only ever emitted where the full decode has one.
        assert full[offset : offset + len(delta)] == delta
        offset += len(delta)


def byte_token(tokenizer: Tokenizer, value: int) -> int:
    """The id of the single-byte token for ``value`` (ids 0-255 are the 256 bytes)."""
    return next(i for i in range(256) if tokenizer.token_bytes(i) == bytes([value]))


def test_emoji_split_into_byte_tokens_is_held_until_complete(qwen_tokenizer: Tokenizer) -> None:
    emoji_ids = [byte_token(qwen_tokenizer, b) for b in "😀".encode()]
    detok = IncrementalDetokenizer(qwen_tokenizer)
    assert [detok.push(i) for i in emoji_ids] == ["", "", "", "😀"]
    assert detok.flush() == ""


def test_chinese_character_split_across_bpe_tokens(qwen_tokenizer: Tokenizer) -> None:
    # Qwen3 spells this rare character with more than one token.
    text = "龘"
    ids = qwen_tokenizer.encode(text)
    assert len(ids) > 1
    deltas = stream(qwen_tokenizer, ids)
    assert deltas[:-2] == [""] * (len(ids) - 1) and deltas[-2:] == [text, ""]


def test_real_text_streams_token_by_token(qwen_tokenizer: Tokenizer) -> None:
    text = "Qwen3 说：你好，世界！🦅🎉 café <think>ok</think>"
    ids = qwen_tokenizer.encode(text)
    deltas = stream(qwen_tokenizer, ids)
    assert "".join(deltas) == text
    assert all(REPLACEMENT not in d for d in deltas)
    assert len([d for d in deltas if d]) > 5  # it really streams


def test_special_tokens_are_skipped_or_kept(qwen_tokenizer: Tokenizer) -> None:
    ids = [151644, *qwen_tokenizer.encode("hi"), 151645]
    assert "".join(stream(qwen_tokenizer, ids)) == "hi"
    assert "".join(stream(qwen_tokenizer, ids, skip_special_tokens=False)) == "<|im_start|>hi<|im_end|>"


def test_incomplete_tail_is_flushed_as_replacement(qwen_tokenizer: Tokenizer) -> None:
    ids = [*qwen_tokenizer.encode("ok"), byte_token(qwen_tokenizer, 0xF0), byte_token(qwen_tokenizer, 0x9F)]
    detok = IncrementalDetokenizer(qwen_tokenizer)
    assert "".join(detok.push(i) for i in ids) == "ok"
    assert detok.flush() == REPLACEMENT
    assert qwen_tokenizer.decode(ids) == "ok" + REPLACEMENT


def test_padding_ids_decode_to_nothing(qwen_tokenizer: Tokenizer) -> None:
    assert stream(qwen_tokenizer, [151_700, 151_935]) == ["", "", ""]


mixed_text = st.text(
    alphabet=st.one_of(
        st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),  # CJK
        st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF),  # emoji
        st.sampled_from("abc xyz,.!\n"),
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
    ),
    max_size=40,
)
random_ids = st.lists(
    st.one_of(
        st.integers(0, VOCAB - 1),
        st.integers(0, 400),  # single bytes and short pieces: many partial characters
        st.integers(VOCAB - 30, PADDED_VOCAB - 1),  # added tokens and embedding padding
    ),
    max_size=48,
)


@settings(max_examples=300, deadline=None)
@given(ids=random_ids, skip=st.booleans())
def test_random_ids_stream_to_the_full_decode(qwen_tokenizer: Tokenizer, ids: list[int], skip: bool) -> None:
    check_stream(qwen_tokenizer, ids, skip)


@settings(max_examples=200, deadline=None)
@given(text=mixed_text, data=st.data())
def test_encoded_text_streams_to_the_full_decode(qwen_tokenizer: Tokenizer, text: str, data: st.DataObject) -> None:
    ids = qwen_tokenizer.encode(text)
    # Also cut the sequence anywhere: a stream may end mid-character (max_tokens).
    cut = data.draw(st.integers(0, len(ids)))
    check_stream(qwen_tokenizer, ids, True)
    check_stream(qwen_tokenizer, ids[:cut], True)
    deltas = stream(qwen_tokenizer, ids)
    assert all(REPLACEMENT not in d or REPLACEMENT in text for d in deltas)


class CountingTokenizer:
    """Forwards token_bytes to the real tokenizer and records what was asked."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.special_token_ids = tokenizer.special_token_ids
        self._tokenizer = tokenizer
        self.requests: list[int] = []

    def token_bytes(self, token_id: int) -> bytes | None:
        self.requests.append(token_id)
        return self._tokenizer.token_bytes(token_id)


def test_each_push_looks_at_its_own_token_only(qwen_tokenizer: Tokenizer) -> None:
    ids = qwen_tokenizer.encode("你好世界🦅 龘 " * 500)
    spy = CountingTokenizer(qwen_tokenizer)
    detok = IncrementalDetokenizer(spy)  # type: ignore[arg-type]
    text = "".join(detok.push(i) for i in ids) + detok.flush()
    assert text == qwen_tokenizer.decode(ids)
    # No re-decoding of earlier tokens, however long the stream: per-push cost is bounded.
    assert spy.requests == ids


def test_a_cut_stream_drops_the_incomplete_character_instead_of_a_replacement(qwen_tokenizer: Tokenizer) -> None:
    ids = [*qwen_tokenizer.encode("ok"), byte_token(qwen_tokenizer, 0xF0), byte_token(qwen_tokenizer, 0x9F)]
    detok = IncrementalDetokenizer(qwen_tokenizer)
    assert "".join(detok.push(i) for i in ids) == "ok"
    assert detok.flush(cut=True) == ""
    # Bytes already known to be invalid are still U+FFFD: only the incomplete tail is dropped.
    detok = IncrementalDetokenizer(qwen_tokenizer)
    pushed = "".join(detok.push(byte_token(qwen_tokenizer, b)) for b in (0xF0, 0x41, 0xE2, 0x82))
    assert pushed == REPLACEMENT + "A" and detok.flush(cut=True) == ""
