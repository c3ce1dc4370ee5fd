"""Anthropic Messages responses: the message body, its stream of events, and the error envelope (sans-IO).

Theory of operation: the route assembles a choice exactly as for chat completions
(:class:`kestrel_trio.openai.ChatChoice`: reasoning split, tool calls, held-back tags) and hands its
streaming items to a :class:`MessageAssembler`, which turns them into Anthropic's events:

* ``message_start`` (the message with empty ``content``, usage with the prompt's ``input_tokens``);
* per content block: ``content_block_start``, then ``content_block_delta`` events (``thinking_delta``
  for reasoning, ``text_delta`` for text, ``input_json_delta`` for a tool call's arguments), then
  ``content_block_stop``; a block closes when output of another kind begins; a tool call's block opens
  once its name is decoded and its ``input_json_delta`` pieces follow as its arguments are; ``ping``
  follows the first ``content_block_start``, as Anthropic sends it;
* ``message_delta`` with ``stop_reason``, ``stop_sequence`` and the ``output_tokens``, then ``message_stop``.

The non-streaming body (:meth:`MessageAssembler.message`) is the sum of the same events, so the two paths
cannot disagree. ``stop_reason``: ``end_turn`` (EOS), ``stop_sequence`` (one of ``stop_sequences``),
``max_tokens`` (the cap or the context), ``tool_use`` (the answer ended with tool calls).
"""

from __future__ import annotations

import json
import secrets

import attrs

from kestrel_trio.errors import KestrelError
from kestrel_trio.openai import to_json_bytes

__all__ = ["MessageAssembler", "new_message_id", "new_tool_use_id", "sse_event", "error_object", "error_body",
           "error_type_for", "stop_reason_of"]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                529: "overloaded_error"}


def new_message_id() -> str:
    """A fresh message id, ``msg_<24 hex digits>`` (96 random bits)."""
    return f"msg_{secrets.token_hex(12)}"


def new_tool_use_id() -> str:
    """A fresh tool-use id, ``toolu_<24 hex digits>`` (96 random bits)."""
    return f"toolu_{secrets.token_hex(12)}"


def error_type_for(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status (``api_error`` for any other 5xx)."""
    return _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_object(status: int, message: str) -> dict:
    """Anthropic's error envelope ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": error_type_for(status), "message": message}}


def error_body(error: KestrelError) -> bytes:
    """Anthropic's error envelope for a :class:`KestrelError`, as JSON bytes."""
    return to_json_bytes(error_object(error.status, error.message))


def sse_event(name: str, obj: dict) -> bytes:
    """One server-sent event as Anthropic frames it: ``event: <name>`` then one ``data:`` line of JSON."""
    return b"event: " + name.encode() + b"\ndata: " + to_json_bytes(obj) + b"\n\n"


def stop_reason_of(finish_reason: str, stop_sequence: str | None) -> str:
    """Anthropic's ``stop_reason`` for a chat choice's ``finish_reason`` (after tool-call detection)."""
    if finish_reason == "tool_calls":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


Event = tuple[str, dict]


@attrs.define
class MessageAssembler:
    """Anthropic events and message of one answer, from a chat choice's streaming items (see module doc).

    Args:
        message_id: the message's ``id``.
        model: the served model id.
        input_tokens: the prompt's tokens.
    """

    message_id: str
    model: str
    input_tokens: int
    _blocks: list = attrs.field(init=False, factory=list)  # the finished content blocks, in order
    _open: dict | None = attrs.field(init=False, default=None)  # the block being streamed
    _arguments: str = attrs.field(init=False, default="")  # the open tool_use block's JSON so far
    _pinged: bool = attrs.field(init=False, default=False)
    stop_reason: str | None = attrs.field(init=False, default=None)
    stop_sequence: str | None = attrs.field(init=False, default=None)
    output_tokens: int = attrs.field(init=False, default=0)

    def start(self) -> list[Event]:
        """``message_start``: the message with no content yet."""
        return [("message_start", {"type": "message_start", "message": self._message([], 0)})]

    def push(self, items: list[dict]) -> list[Event]:
        """Events for a chat choice's streaming ``choices[i]`` items (their ``finish_reason`` is not read)."""
        events: list[Event] = []
        for item in items:
            delta = item["delta"]
            if delta.get("reasoning_content"):
                events += self._extend("thinking", "thinking_delta", "thinking", delta["reasoning_content"])
            if delta.get("content"):
                events += self._extend("text", "text_delta", "text", delta["content"])
            for call in delta.get("tool_calls") or ():
                if "id" in call:
                    events += self._close()
                    events += self._begin({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                                           "input": {}})
                elif call["function"]["arguments"]:
                    self._arguments += call["function"]["arguments"]
                    events.append(self._delta({"type": "input_json_delta",
                                               "partial_json": call["function"]["arguments"]}))
        return events

    def finish(self, finish_reason: str, stop_sequence: str | None, output_tokens: int) -> list[Event]:
        """The last events: the open block's stop, ``message_delta`` (stop reason, usage), ``message_stop``."""
        events = self._close()
        if not self._pinged:
            self._pinged = True
            events.append(("ping", {"type": "ping"}))
        self.stop_reason = stop_reason_of(finish_reason, stop_sequence)
        self.stop_sequence = stop_sequence if self.stop_reason == "stop_sequence" else None
        self.output_tokens = output_tokens
        delta = {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence}
        events.append(("message_delta", {"type": "message_delta", "delta": delta,
                                         "usage": {"output_tokens": output_tokens}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def message(self) -> dict:
        """The non-streaming body, after :meth:`finish`."""
        return self._message(list(self._blocks), self.output_tokens, self.stop_reason, self.stop_sequence)

    def _message(self, content: list, output_tokens: int, stop_reason: str | None = None,
                 stop_sequence: str | None = None) -> dict:
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": output_tokens}}

    def _extend(self, kind: str, delta_type: str, key: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            events += self._begin(start)
        assert self._open is not None
        self._open[key] += text
        events.append(self._delta({"type": delta_type, key: text}))
        return events

    def _begin(self, block: dict) -> list[Event]:
        self._open = dict(block)
        self._arguments = ""
        index = len(self._blocks)
        events: list[Event] = [("content_block_start", {"type": "content_block_start", "index": index,
                                                        "content_block": block})]
        if not self._pinged:
            self._pinged = True
            events.append(("ping", {"type": "ping"}))
        return events

    def _delta(self, delta: dict) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": len(self._blocks), "delta": delta})

    def _close(self) -> list[Event]:
        block = self._open
        if block is None:
            return []
        if block["type"] == "tool_use":
            block["input"] = _tool_input(self._arguments)
        self._blocks.append(block)
        self._open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": len(self._blocks) - 1})]


def _tool_input(arguments: str) -> dict:
    """A tool_use block's ``input``: its streamed JSON, or ``{}`` when the answer stopped inside it.

    The ``input_json_delta`` pieces already sent hold the cut-off text; ``stop_reason`` is then ``max_tokens``
    (or ``stop_sequence``), so a client knows the call is incomplete.
    """
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
