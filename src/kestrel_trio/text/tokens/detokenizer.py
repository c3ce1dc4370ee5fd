"""Turning a stream of token ids into a stream of text deltas.

Theory of operation: byte-level BPE tokens are byte strings, and a character
of Chinese or an emoji (2-4 UTF-8 bytes) is often split across two or three
tokens. Decoding each token on its own would emit U+FFFD halves. Instead each
token's bytes go through one incremental UTF-8 decoder (errors="replace"),
which emits every complete character at once and holds back only an
incomplete tail of at most 3 bytes: the deltas never end inside a character,
and an unfinished tail stays held until the bytes that complete it (or prove
it invalid) arrive, so a U+FFFD is emitted only where the full decode has one.
Because the replacement policy of Python's decoder and of the tokenizer's
(Rust ``from_utf8_lossy``: one U+FFFD per maximal invalid subpart) agree, the
concatenated deltas plus :meth:`IncrementalDetokenizer.flush` equal
``tokenizer.decode(all_ids)`` exactly. Each push costs O(token length),
however long the sequence or however long a run of invalid bytes.

A stream cut short (``max_tokens`` reached between two tokens of one
character) ends with ``flush(cut=True)``: the held bytes are the start of a
valid character whose remaining bytes were never generated, so they are
dropped rather than sent as U+FFFD. Text therefore never ends inside a
character, and a U+FFFD still marks only bytes that are invalid.
"""

from __future__ import annotations

import codecs

from kestrel_trio.text.tokens.tokenizer import Tokenizer

__all__ = ["IncrementalDetokenizer"]


class IncrementalDetokenizer:
    """Streaming decode of one generation.

    Args:
        tokenizer: the byte-level tokenizer that produced the ids.
        skip_special_tokens: drop special tokens (``<|im_end|>`` ...), as
            ``Tokenizer.decode`` does by default.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skipped = tokenizer.special_token_ids if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Feed one token id; returns the newly completed text (possibly "")."""
        if token_id in self._skipped:
            return ""
        raw = self._tokenizer.token_bytes(token_id)
        if raw is None:  # ids past the vocabulary (embedding padding) decode to nothing
            return ""
        return self._utf8.decode(raw)

    def flush(self, *, cut: bool = False) -> str:
        """End of stream: the held-back tail (at most 3 bytes of one character that never completed).

        Args:
            cut: the stream was cut short (max_tokens), not ended by the model: the tail is the
                start of a character whose other bytes were never generated, and it is dropped ("").
                Otherwise the tail decodes as U+FFFD, as ``tokenizer.decode`` of all the ids does.
        """
        if cut:
            self._utf8.reset()
            return ""
        return self._utf8.decode(b"", final=True)
