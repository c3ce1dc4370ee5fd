"""Qwen3 (Hermes-style) tool calls in model output -> OpenAI ``tool_calls``.

Theory of operation (a sans-IO state machine fed decoded content deltas):

* In *content* mode text passes through, except that a suffix which could
  still grow into ``<tool_call>`` is held back (as the reasoning splitter holds
  back ``</th``), and so is trailing whitespace: whitespace right before a
  call, or between and after calls, is framing and is dropped; anywhere else
  it is released with the next text or at :meth:`ToolCallParser.flush`.
* ``<tool_call>`` switches to *call* mode, where text is buffered until
  ``</tool_call>``. The buffer must then be one JSON object
  ``{"name": str, "arguments": object}`` (``arguments`` may also be a JSON
  string holding an object, or absent). A valid call becomes a
  :class:`ToolCall`; anything else is released as literal content, tags
  included, so malformed model output degrades to text and never to an error.
* A call is released only once it is complete, never in pieces: that is what
  lets a malformed call fall back to content after the fact. A stream thus
  shows each call as OpenAI's first tool-call delta (index, id, type, name,
  ``arguments: ""``) followed at once by its argument text.
* At :meth:`ToolCallParser.flush` (end of output) an unclosed call is accepted
  if its buffer is already a valid call (the model stopped right before the
  closing tag), else released as content.

Both the streaming and the complete-output paths run this same machine, so
the two always agree.
"""

from __future__ import annotations

import json
import secrets
from typing import Union

import attrs

__all__ = [
    "ToolCall", "ToolCallParser", "parse_tool_calls", "new_call_id", "forced_tool_prefix", "TOOL_CALL_START", "TOOL_CALL_END",
]

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


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

    def as_openai(self, index: int | None = None) -> dict:
        """The OpenAI ``tool_calls`` item (with ``index`` when given, as in streams)."""
        out: dict = {} if index is None else {"index": index}
        out.update(id=self.id, type="function", function={"name": self.name, "arguments": self.arguments})
        return out


Piece = Union[str, ToolCall]  # noqa: UP007 (a runtime alias; 3.10 has no str | attrs class at runtime issue, kept explicit)


@attrs.define
class ToolCallParser:
    """Streaming extractor of ``<tool_call>...</tool_call>`` blocks (see module doc).

    Args:
        make_id: the id generator (tests pass a deterministic one).
    """

    make_id: object = new_call_id
    _in_call: bool = attrs.field(init=False, default=False)
    _buffer: str = attrs.field(init=False, default="")  # call body, or held-back content
    _calls: int = attrs.field(init=False, default=0)
    _strip_leading: bool = attrs.field(init=False, default=False)  # right after a call
    _framing: str = attrs.field(init=False, default="")  # whitespace before the open call's tag

    @property
    def calls(self) -> int:
        """Tool calls produced so far."""
        return self._calls

    def push(self, delta: str) -> list[Piece]:
        """Feed the next content delta; returns content strings and calls that became final, in order."""
        text = self._buffer + delta
        self._buffer = ""
        out: list[Piece] = []
        while text:
            if self._in_call:
                end = text.find(TOOL_CALL_END)
                if end == -1:
                    self._buffer = text
                    break
                self._close_call(text[:end], out, closed=True)
                text = text[end + len(TOOL_CALL_END):]
            else:
                start = text.find(TOOL_CALL_START)
                if start == -1:
                    self._hold_content(text, out)
                    break
                before = text[:start]
                kept = before.rstrip()
                self._emit_content(kept, out)
                self._framing = before[len(kept):]
                self._in_call = True
                text = text[start + len(TOOL_CALL_START):]
        return out

    def flush(self) -> list[Piece]:
        """End of output: release what is held back (an unclosed call, content)."""
        out: list[Piece] = []
        if self._in_call:
            self._close_call(self._buffer, out, closed=False)
        else:
            self._emit_content(self._buffer, out, final=True)
        self._buffer = ""
        return out

    def _hold_content(self, text: str, out: list[Piece]) -> None:
        keep = _partial_tag_length(text)
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

    def _close_call(self, body: str, out: list[Piece], *, closed: bool) -> None:
        self._in_call = False
        call = _parse_call(body, self.make_id)
        if call is None:
            self._strip_leading = False
            literal = self._framing + TOOL_CALL_START + body + (TOOL_CALL_END if closed else "")
            self._emit_content(literal, out)
            return
        self._calls += 1
        self._strip_leading = True
        out.append(call)


def _parse_call(body: str, make_id) -> ToolCall | None:
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
        if not isinstance(decoded, dict):
            return None
        return ToolCall(make_id(), obj["name"], arguments)
    if not isinstance(arguments, dict):
        return None
    return ToolCall(make_id(), obj["name"], json.dumps(arguments, ensure_ascii=False))


def _partial_tag_length(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for length in range(min(len(text), len(TOOL_CALL_START) - 1), 0, -1):
        if TOOL_CALL_START.startswith(text[-length:]):
            return length
    return 0


def parse_tool_calls(text: str, make_id=new_call_id) -> tuple[str, tuple[ToolCall, ...]]:
    """Split a complete output into ``(content, tool_calls)``; see :class:`ToolCallParser`."""
    parser = ToolCallParser(make_id)
    pieces = parser.push(text) + parser.flush()
    content = "".join(p for p in pieces if isinstance(p, str))
    return content, tuple(p for p in pieces if isinstance(p, ToolCall))


def forced_tool_prefix(tool_choice: str | dict | None) -> str:
    """The start of the answer that ``tool_choice`` forces, appended to the prompt.

    ``"required"`` opens a call (``<tool_call>\\n``); a named function also
    writes its name up to the arguments, so the model continues inside a call
    (to that function). Only the opening is enforced: the rest is still
    free text (no grammar), and a malformed continuation still degrades to
    content with a finish_reason other than ``tool_calls``. ``"none"`` and
    ``"auto"`` force nothing.
    """
    if tool_choice == "required":
        return TOOL_CALL_START + "\n"
    if isinstance(tool_choice, dict):
        name = json.dumps(tool_choice["function"]["name"], ensure_ascii=False)
        return TOOL_CALL_START + '\n{"name": ' + name + ', "arguments": '
    return ""
