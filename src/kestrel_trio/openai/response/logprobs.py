"""Token logprobs in OpenAI's two shapes: chat ``logprobs.content`` and legacy completions.

The values come from the text layer (see :mod:`kestrel_trio.text.sampling.sampler`
for which distribution they describe); this module only spells them. A token
is shown as its text when its bytes are valid UTF-8 on their own, else as
``bytes:\\xNN...`` (OpenAI's convention for a piece of a character); ``bytes``
always holds the exact bytes.
"""

from __future__ import annotations

import codecs

import attrs

__all__ = ["LogprobToken", "TokenLogprob", "token_text", "chat_logprobs", "CompletionLogprobs"]


def token_text(raw: bytes) -> str:
    """The display text of a token's bytes (``bytes:\\xe2\\x80`` when not valid UTF-8 alone)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


@attrs.frozen
class LogprobToken:
    """One token and its log-probability (natural log).

    Attributes:
        raw: the token's bytes.
        logprob: its log-probability (<= 0; may be -inf for an impossible token).
    """

    raw: bytes
    logprob: float

    def as_chat(self) -> dict:
        """``{"token", "logprob", "bytes"}`` as in chat ``top_logprobs`` items."""
        return {"token": token_text(self.raw), "logprob": _finite(self.logprob), "bytes": list(self.raw)}


@attrs.frozen
class TokenLogprob:
    """A generated token with its alternatives.

    Attributes:
        chosen: the token generated.
        top: the most likely tokens, most likely first.
    """

    chosen: LogprobToken
    top: tuple[LogprobToken, ...] = ()


def _finite(value: float) -> float:
    # JSON has no -Infinity; OpenAI clients expect a number. -9999.0 is vLLM's stand-in.
    return max(-9999.0, value)


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    """The chat ``choices[i].logprobs`` object: ``{"content": [...], "refusal": None}``."""
    content = [{**entry.chosen.as_chat(), "top_logprobs": [alt.as_chat() for alt in entry.top]} for entry in entries]
    return {"content": content, "refusal": None}


@attrs.define
class CompletionLogprobs:
    """Builds legacy completions ``logprobs`` objects, chunk by chunk, with running text offsets.

    Args:
        start_offset: characters of text before the first token (the echoed prompt), for ``text_offset``.
    """

    start_offset: int = 0
    _decoder: codecs.IncrementalDecoder = attrs.field(init=False, factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    _offset: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._offset = self.start_offset

    def build(self, entries: list[TokenLogprob]) -> dict:
        """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` for the next tokens.

        ``top_logprobs[i]`` maps token text to logprob for the alternatives
        asked for plus the chosen token (as vLLM does), so it is never empty.
        """
        out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for entry in entries:
            out["tokens"].append(token_text(entry.chosen.raw))
            out["token_logprobs"].append(_finite(entry.chosen.logprob))
            top = {token_text(alt.raw): _finite(alt.logprob) for alt in entry.top}
            top.setdefault(token_text(entry.chosen.raw), _finite(entry.chosen.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self._offset)
            self._offset += len(self._decoder.decode(entry.chosen.raw))
        return out
