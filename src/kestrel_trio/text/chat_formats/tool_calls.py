"""Tool calls delimited by a family's tags in model output -> call pieces, streamed as they are written.

The tags are the family's (Hermes' ``<tool_call>`` / ``</tool_call>``, used by Qwen2.5 and Qwen3:
:mod:`.hermes`); the examples below use them. The pieces are API-neutral: the API layers turn them into
their wire shapes (OpenAI's ``tool_calls``, Anthropic's ``tool_use``, Ollama's ``tool_calls``).

Theory of operation (a sans-IO state machine fed decoded content deltas):

* In *content* mode text passes through, except that a suffix which could
  still grow into ``<tool_call>`` is held back (as the reasoning splitter holds
  back ``</th``), and so is trailing whitespace: whitespace right before a
  call, or between and after calls, is framing and is dropped; anywhere else
  it is released with the next text or at :meth:`ToolCallParser.flush`.
* ``<tool_call>`` switches to *call* mode. The call's body is read as it
  grows (:mod:`.call_json`): once it holds the head
  ``{"name": "<name>", "arguments": {``, the call is committed: a
  :class:`CallStart` (a fresh id, the name) is released, then every piece of
  the arguments object as a :class:`CallArguments`, the model's own text, up
  to the object's closing brace. What follows it up to ``</tool_call>`` is
  framing. A suffix that could still grow into ``</tool_call>`` is held back,
  so no piece of the closing tag is ever sent as arguments.
* A committed call stays a call whatever follows: if the output stops inside
  the arguments (``max_tokens``, a stop sequence), the arguments are the text
  written so far, as OpenAI sends a call cut off by ``length``. Under the
  server's tool grammar a call the model writes is always well formed.
* A body whose head is anything else (the arguments first, the arguments as a
  JSON string, no arguments, not JSON) is buffered to ``</tool_call>`` and
  then read whole: ``{"name": str, "arguments": object}`` (``arguments`` may
  also be a JSON string holding an object, or absent) becomes a
  :class:`CallStart` and one :class:`CallArguments`; anything else is released
  as literal content, tags included, so malformed model output degrades to
  text and never to an error.
* At :meth:`ToolCallParser.flush` (end of output) an unclosed, uncommitted call
  is accepted if its buffer is already a valid call (the model stopped right
  before the closing tag), else released as content.

Both the streaming and the complete-output paths run this same machine, so
the two always agree, however the text was cut into deltas.
"""

from __future__ import annotations

import json
import secrets
from typing import Union

import attrs

from kestrel_trio.text.chat_formats.call_json import MISMATCH, PARTIAL, Head, ObjectEnd, match_head

__all__ = ["ToolCallTags", "ToolCall", "CallStart", "CallArguments", "ToolCallParser", "parse_tool_calls",
           "assemble", "new_call_id"]


@attrs.frozen
class ToolCallTags:
    """The text around one tool call's JSON body (``<tool_call>`` / ``</tool_call>`` in Hermes' format)."""

    start: str
    end: str


def new_call_id() -> str:
    """A fresh tool-call id, ``call_<24 hex digits>`` (96 random bits)."""
    return f"call_{secrets.token_hex(12)}"


@attrs.frozen
class ToolCall:
    """One complete tool call.

    Attributes:
        id: ``call_<hex>``.
        name: the function name.
        arguments: the arguments as a JSON-encoded object (a string).
    """

    id: str
    name: str
    arguments: str


@attrs.frozen
class CallStart:
    """A tool call begins: its id and function name (its arguments follow as :class:`CallArguments`)."""

    kind = "call"  # how the API layers, which do not import this module, tell the pieces apart
    id: str
    name: str


@attrs.frozen
class CallArguments:
    """The next piece of the arguments (JSON text) of the call begun last."""

    kind = "arguments"
    text: str


Piece = Union[str, CallStart, CallArguments]  # noqa: UP007 (a runtime alias)

# Call-mode states: reading the head; buffering a body of another shape; streaming the arguments; after them.
_HEAD, _WHOLE, _ARGUMENTS, _AFTER = "head", "whole", "arguments", "after"


@attrs.define
class ToolCallParser:
    """Streaming extractor of ``<tool_call>...</tool_call>`` blocks (see module doc).

    Args:
        tags: the family's tool-call tags.
        make_id: the id generator (tests pass a deterministic one).
    """

    tags: ToolCallTags
    make_id: object = new_call_id
    _in_call: bool = attrs.field(init=False, default=False)
    _buffer: str = attrs.field(init=False, default="")  # held-back text: content, or a partial closing tag
    _body: str = attrs.field(init=False, default="")  # the open call's body read so far (head and whole states)
    _state: str = attrs.field(init=False, default=_HEAD)
    _end: ObjectEnd = attrs.field(init=False, factory=ObjectEnd)
    _calls: int = attrs.field(init=False, default=0)
    _strip_leading: bool = attrs.field(init=False, default=False)  # right after a call
    _framing: str = attrs.field(init=False, default="")  # whitespace before the open call's tag

    @property
    def calls(self) -> int:
        """Tool calls begun so far."""
        return self._calls

    def push(self, delta: str) -> list[Piece]:
        """Feed the next content delta; returns the content strings and call pieces that became final, in order."""
        text = self._buffer + delta
        self._buffer = ""
        out: list[Piece] = []
        while text:
            if self._in_call:
                end = text.find(self.tags.end)
                if end == -1:
                    keep = _partial_length(text, self.tags.end)
                    self._read_body(text[: len(text) - keep], out)
                    self._buffer = text[len(text) - keep:]
                    break
                self._read_body(text[:end], out)
                self._close_call(out, closed=True)
                text = text[end + len(self.tags.end):]
            else:
                start = text.find(self.tags.start)
                if start == -1:
                    self._hold_content(text, out)
                    break
                before = text[:start]
                kept = before.rstrip()
                self._emit_content(kept, out)
                self._framing = before[len(kept):]
                self._open_call()
                text = text[start + len(self.tags.start):]
        return out

    def flush(self) -> list[Piece]:
        """End of output: release what is held back (an unclosed call, content)."""
        out: list[Piece] = []
        if self._in_call:
            self._read_body(self._buffer, out)
            self._close_call(out, closed=False)
        else:
            self._emit_content(self._buffer, out, final=True)
        self._buffer = ""
        return out

    def _open_call(self) -> None:
        self._in_call, self._state, self._body, self._end = True, _HEAD, "", ObjectEnd()

    def _read_body(self, text: str, out: list[Piece]) -> None:
        """The next text of the open call's body (no closing tag in it)."""
        if not text or self._state == _AFTER:
            return
        if self._state == _ARGUMENTS:
            self._stream_arguments(text, out)
            return
        self._body += text
        if self._state == _HEAD:
            head = match_head(self._body)
            if head == MISMATCH:
                self._state = _WHOLE
            elif head != PARTIAL:
                assert isinstance(head, Head)
                self._commit(CallStart(self.make_id(), head.name), out)
                self._state = _ARGUMENTS
                self._stream_arguments(self._body[head.arguments_at:], out)

    def _stream_arguments(self, text: str, out: list[Piece]) -> None:
        taken = self._end.feed(text)
        if taken:
            out.append(CallArguments(text[:taken]))
        if self._end.closed:
            self._state = _AFTER

    def _commit(self, start: CallStart, out: list[Piece]) -> None:
        self._calls += 1
        out.append(start)

    def _hold_content(self, text: str, out: list[Piece]) -> None:
        keep = _partial_length(text, self.tags.start)
        body, partial = text[: len(text) - keep], text[len(text) - keep:]
        stripped = body.rstrip()
        self._emit_content(stripped, out)
        self._buffer = body[len(stripped):] + partial

    def _emit_content(self, text: str, out: list[Piece], final: bool = False) -> None:
        if self._strip_leading:
            text = text.lstrip()
        if final and self._calls:
            text = text.rstrip()
        if text:
            self._strip_leading = False
            if out and isinstance(out[-1], str):
                out[-1] += text
            else:
                out.append(text)

    def _close_call(self, out: list[Piece], *, closed: bool) -> None:
        self._in_call = False
        if self._state in (_ARGUMENTS, _AFTER):  # committed: a call whatever the rest was
            self._strip_leading = True
            return
        call = _parse_call(self._body)
        if call is None:
            self._strip_leading = False
            literal = self._framing + self.tags.start + self._body + (self.tags.end if closed else "")
            self._emit_content(literal, out)
            return
        name, arguments = call
        self._commit(CallStart(self.make_id(), name), out)
        out.append(CallArguments(arguments))
        self._strip_leading = True


def _parse_call(body: str) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` of a whole call body of any accepted shape, or None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return None
        return (obj["name"], arguments) if isinstance(decoded, dict) else None
    if not isinstance(arguments, dict):
        return None
    return obj["name"], json.dumps(arguments, ensure_ascii=False)


def _partial_length(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


def parse_tool_calls(tags: ToolCallTags, text: str, make_id=new_call_id) -> tuple[str, tuple[ToolCall, ...]]:
    """Split a complete output into ``(content, tool_calls)``; see :class:`ToolCallParser`."""
    parser = ToolCallParser(tags, make_id)
    return assemble(parser.push(text) + parser.flush())


def assemble(pieces: list[Piece]) -> tuple[str, tuple[ToolCall, ...]]:
    """The content and the whole calls that a parser's pieces add up to."""
    content: list[str] = []
    calls: list[list[str]] = []
    for piece in pieces:
        if isinstance(piece, str):
            content.append(piece)
        elif isinstance(piece, CallStart):
            calls.append([piece.id, piece.name, ""])
        else:
            calls[-1][2] += piece.text
    return "".join(content), tuple(ToolCall(*call) for call in calls)

