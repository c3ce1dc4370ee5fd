"""One chat choice, assembled from generated text deltas: reasoning, content, tool calls, logprobs.

Theory of operation (sans-IO; the route feeds it each engine delta in order):

* Text goes through the model family's output parser (the app layer picks it:
  :mod:`kestrel_trio.text.chat_formats`), which splits it into reasoning, content
  and tool-call pieces; this module only turns those pieces into OpenAI's shapes.
  :meth:`ChatChoice.push` returns the streaming ``choices[i]`` items that became
  final; :meth:`ChatChoice.finish` ends the parse and returns the rest, ending
  with the ``finish_reason`` item.
* Every item is also accumulated, so :meth:`ChatChoice.message_choice` (the
  non-streaming ``choices[i]``) is exactly the sum of the streamed items: the
  two paths cannot disagree.
* A tool call is streamed as OpenAI does: a first item with ``index``, ``id``,
  ``type``, ``function.name`` and ``arguments: ""`` as soon as the name is
  read, then the argument text in pieces as it is decoded; the message's
  ``arguments`` is those pieces joined.
* Logprobs of tokens whose text is still held back wait for the next item
  that is sent (at the latest, the finish item), so none is lost or repeated.
  They cover every generated token, reasoning and tool-call tokens included
  (as vLLM reports them), except the EOS / stop token that ended the answer.
* ``finish_reason`` becomes ``"tool_calls"`` when the output held at least
  one valid call and ended naturally (``"stop"``); ``"length"`` stays.
* With ``parallel_tool_calls`` false (the request's ``parallel_tool_calls:
  false``) only the first valid call is returned; later ones the model writes
  are dropped, from the stream and the message alike.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from kestrel_trio.openai.response.logprobs import CompletionLogprobs, TokenLogprob, chat_logprobs

__all__ = ["ChatChoice", "CompletionChoice", "OutputParser"]


class OutputParser(Protocol):
    """What :class:`ChatChoice` reads its text through (``kestrel_trio.text.chat_formats.ChatOutputParser``).

    Each call returns ``(reasoning, pieces)``: reasoning text, then content strings and tool-call pieces in
    order. A piece of kind ``"call"`` starts a call (its ``id`` and ``name``); one of kind ``"arguments"``
    is the next ``text`` of the arguments (JSON) of the call started last.
    """

    def push(self, text: str) -> tuple[str, list]: ...

    def finish(self) -> tuple[str, list]: ...


@attrs.define
class ChatChoice:
    """The assembly of one chat choice (see module doc).

    Args:
        index: the choice's ``index``.
        output: the parser of the model's output (reasoning, tool calls), or None: all of it is content.
        logprobs: report logprobs (``logprobs: true``).
        parallel_tool_calls: False: return only the first tool call.
    """

    index: int = 0
    output: OutputParser | None = None
    logprobs: bool = False
    parallel_tool_calls: bool = True
    _pending: list = attrs.field(init=False, factory=list)
    _content: list = attrs.field(init=False, factory=list)
    _reasoning: list = attrs.field(init=False, factory=list)
    _calls: list = attrs.field(init=False, factory=list)  # [id, name, [argument pieces]] of each call sent
    _dropping: bool = attrs.field(init=False, default=False)  # inside a call parallel_tool_calls drops
    _entries: list = attrs.field(init=False, factory=list)
    finish_reason: str | None = attrs.field(init=False, default=None)

    def start(self) -> list[dict]:
        """The first streaming item: ``delta`` ``{"role": "assistant", "content": ""}``."""
        return [{"index": self.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None}]

    def push(self, text: str, entries: list[TokenLogprob] = ()) -> list[dict]:
        """Feed one delta's text and its tokens' logprobs; returns streaming ``choices`` items."""
        self._pending.extend(entries)
        self._entries.extend(entries)
        if not text:
            return []
        return self._items(*(self.output.push(text) if self.output else ("", [text])))

    def finish(self, finish_reason: str) -> list[dict]:
        """End of output: the remaining items, the last one carrying the finish_reason."""
        items = self._items(*(self.output.finish() if self.output else ("", [])))
        self.finish_reason = "tool_calls" if self._calls and finish_reason == "stop" else finish_reason
        items.append(self._item({}, self.finish_reason))
        return items

    def message_choice(self) -> dict:
        """The non-streaming ``choices[i]``, after :meth:`finish`."""
        content = "".join(self._content)
        # "refusal" is required (nullable) by OpenAI's spec; this server never refuses in words of its own.
        message: dict = {"role": "assistant", "content": None if (self._calls and not content) else content,
                         "refusal": None}
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        if self._calls:
            message["tool_calls"] = [{"id": id, "type": "function",
                                      "function": {"name": name, "arguments": "".join(pieces)}}
                                     for id, name, pieces in self._calls]
        logprobs = chat_logprobs(self._entries) if self.logprobs else None
        return {"index": self.index, "message": message, "logprobs": logprobs, "finish_reason": self.finish_reason}

    def _items(self, reasoning: str, pieces: list) -> list[dict]:
        items: list[dict] = []
        delta: dict = {}
        if reasoning:
            self._reasoning.append(reasoning)
            delta["reasoning_content"] = reasoning
        for piece in pieces:
            if isinstance(piece, str):
                self._content.append(piece)
                delta["content"] = delta.get("content", "") + piece
                continue
            if piece.kind == "call":
                # One call was asked for: the model's later calls are dropped, from the stream and the message.
                self._dropping = bool(self._calls) and not self.parallel_tool_calls
            if self._dropping:
                continue
            if delta:
                items.append(self._item(delta))
                delta = {}
            items.append(self._item({"tool_calls": [self._call_delta(piece)]}))
        if delta:
            items.append(self._item(delta))
        return items

    def _call_delta(self, piece) -> dict:
        """The ``delta.tool_calls`` item of a call's start (id, type, name) or of a piece of its arguments."""
        if piece.kind == "call":
            self._calls.append((piece.id, piece.name, []))
            return {"index": len(self._calls) - 1, "id": piece.id, "type": "function",
                    "function": {"name": piece.name, "arguments": ""}}
        self._calls[-1][2].append(piece.text)
        return {"index": len(self._calls) - 1, "function": {"arguments": piece.text}}

    def _item(self, delta: dict, finish_reason: str | None = None) -> dict:
        logprobs = None
        if self.logprobs and self._pending:
            logprobs = chat_logprobs(self._pending)
            self._pending = []
        return {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


@attrs.define
class CompletionChoice:
    """The assembly of one legacy completions choice; same contract as :class:`ChatChoice`.

    With ``echo``, the prompt's own tokens get no logprobs (OpenAI's legacy
    API would score them too); ``text_offset`` counts from the start of the
    echoed text, so the first generated token's offset is ``len(echo)``.

    Args:
        index: the choice's ``index``.
        echo: the prompt text to prepend (``echo: true``), or ``""``.
        logprobs: report logprobs (``logprobs`` was an integer).
    """

    index: int = 0
    echo: str = ""
    logprobs: bool = False
    _builder: CompletionLogprobs = attrs.field(init=False)
    _pending: list = attrs.field(init=False, factory=list)
    _entries: list = attrs.field(init=False, factory=list)
    _text: list = attrs.field(init=False, factory=list)
    finish_reason: str | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._builder = CompletionLogprobs(len(self.echo))

    def start(self) -> list[dict]:
        """The first streaming items: the echoed prompt, if any."""
        return [self._item(self.echo)] if self.echo else []

    def push(self, text: str, entries: list[TokenLogprob] = ()) -> list[dict]:
        """Feed one delta; returns streaming ``choices`` items (none while text is held back)."""
        self._pending.extend(entries)
        self._entries.extend(entries)
        if not text:
            return []
        self._text.append(text)
        return [self._item(text)]

    def finish(self, finish_reason: str) -> list[dict]:
        """The last streaming item, carrying the finish_reason."""
        self.finish_reason = finish_reason
        return [self._item("", finish_reason)]

    def full_choice(self) -> dict:
        """The non-streaming ``choices[i]``, after :meth:`finish`."""
        logprobs = CompletionLogprobs(len(self.echo)).build(self._entries) if self.logprobs else None
        return {"text": self.echo + "".join(self._text), "index": self.index, "logprobs": logprobs,
                "finish_reason": self.finish_reason}

    def _item(self, text: str, finish_reason: str | None = None) -> dict:
        logprobs = None
        if self.logprobs:
            logprobs = self._builder.build(self._pending)
            self._pending = []
        return {"text": text, "index": self.index, "logprobs": logprobs, "finish_reason": finish_reason}
