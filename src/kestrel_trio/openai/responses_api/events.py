"""OpenAI Responses answers: the Response object, its stream of events, and their SSE framing (sans-IO).

Theory of operation: the route assembles a choice exactly as for chat completions
(:class:`kestrel_trio.openai.ChatChoice`: reasoning split, tool calls, held-back tags) and hands its streaming
items to a :class:`ResponseAssembler`, which turns them into the Responses events, each with the next
``sequence_number`` (from 0):

* ``response.created`` then ``response.in_progress`` (the Response, ``status: in_progress``, no output);
* per output item, in order: ``response.output_item.added``, then

  - a ``reasoning`` item (the model's reasoning, as ``reasoning_text`` content): ``response.content_part.added``,
    ``response.reasoning_text.delta`` events, ``response.reasoning_text.done``, ``response.content_part.done``;
  - a ``message`` item (the answer): ``response.content_part.added`` (an ``output_text`` part),
    ``response.output_text.delta`` events, ``response.output_text.done``, ``response.content_part.done``;
  - a ``function_call`` item (one tool call): ``response.function_call_arguments.delta`` events, then
    ``response.function_call_arguments.done``;

  then ``response.output_item.done``; an item closes when output of another kind begins;
* ``response.completed`` (``response.incomplete`` with ``incomplete_details.reason: max_output_tokens`` when
  the answer was cut by ``max_output_tokens`` or the context), carrying the whole Response and its usage;
* on a failure after the stream began: ``error``, then ``response.failed`` (``status: failed``, ``error``).

The non-streaming body (:meth:`ResponseAssembler.response`) is the final event's Response, so the two paths
cannot disagree.
"""

from __future__ import annotations

import secrets

import attrs

from kestrel_trio.openai.response.bodies import to_json_bytes

__all__ = ["ResponseAssembler", "new_response_id", "sse_event"]


def new_response_id() -> str:
    """A fresh response id, ``resp_<32 hex digits>`` (128 random bits)."""
    return f"resp_{secrets.token_hex(16)}"


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def sse_event(event: dict) -> bytes:
    """One server-sent event as OpenAI frames Responses events: ``event: <type>`` then one ``data:`` line."""
    return b"event: " + event["type"].encode() + b"\ndata: " + to_json_bytes(event) + b"\n\n"


@attrs.define
class ResponseAssembler:
    """The Responses events and Response object of one answer, from a chat choice's streaming items.

    Args:
        response_id: the Response's ``id``.
        model: the served model id.
        created_at: Unix time (seconds) the request was received.
        echo: the request's fields as the Response reports them (:attr:`ResponsesRequest.echo`).
        input_tokens: the prompt's tokens.
    """

    response_id: str
    model: str
    created_at: int
    echo: dict
    input_tokens: int
    _sequence: int = attrs.field(init=False, default=0)
    _output: list = attrs.field(init=False, factory=list)  # finished output items, in order
    _open: dict | None = attrs.field(init=False, default=None)  # the item being streamed
    _reasoning_tokens: int = attrs.field(init=False, default=0)
    _final: dict | None = attrs.field(init=False, default=None)

    def start(self) -> list[dict]:
        """``response.created`` and ``response.in_progress``."""
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    def push(self, items: list[dict], tokens_so_far: int) -> list[dict]:
        """Events for a chat choice's streaming ``choices[i]`` items (their ``finish_reason`` is not read).

        Args:
            items: the items of one engine delta.
            tokens_so_far: tokens generated up to and including that delta (counts the reasoning tokens).
        """
        events: list[dict] = []
        for item in items:
            delta = item["delta"]
            if delta.get("reasoning_content"):
                self._reasoning_tokens = tokens_so_far
                events += self._text("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                events += self._text("message", delta["content"])
            for call in delta.get("tool_calls") or ():
                if "id" in call:
                    events += self._close("completed")
                    events += self._begin({"id": _item_id("fc"), "type": "function_call", "status": "in_progress",
                                           "call_id": call["id"], "name": call["function"]["name"],
                                           "arguments": ""})
                elif call["function"]["arguments"]:
                    assert self._open is not None
                    self._open["arguments"] += call["function"]["arguments"]
                    events.append(self._event("response.function_call_arguments.delta", item_id=self._open["id"],
                                              output_index=len(self._output),
                                              delta=call["function"]["arguments"]))
        return events

    def finish(self, finish_reason: str, output_tokens: int, cached_tokens: int = 0,
               completed_at: int | None = None) -> list[dict]:
        """The last events: the open item's end and ``response.completed`` (or ``response.incomplete``).

        Args:
            finish_reason: the chat choice's (``length``: cut by max_output_tokens or the context).
            output_tokens: the tokens generated.
            cached_tokens: prompt tokens whose KV came from the prefix cache.
            completed_at: Unix time (seconds) the answer ended.
        """
        cut = finish_reason == "length"
        events = self._close("incomplete" if cut else "completed")
        usage = {"input_tokens": self.input_tokens,
                 "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
                 "output_tokens": output_tokens,
                 "output_tokens_details": {"reasoning_tokens": min(self._reasoning_tokens, output_tokens)},
                 "total_tokens": self.input_tokens + output_tokens}
        if cut:
            self._final = self._response("incomplete", usage=usage,
                                         incomplete_details={"reason": "max_output_tokens"})
            return events + [self._event("response.incomplete", response=self._final)]
        self._final = self._response("completed", usage=usage, completed_at=completed_at)
        return events + [self._event("response.completed", response=self._final)]

    def fail(self, message: str, code: str = "server_error") -> list[dict]:
        """The events of a failure after the stream began: ``error``, then ``response.failed``."""
        events = self._close("incomplete")
        events.append(self._event("error", code=code, message=message, param=None))
        self._final = self._response("failed", error={"code": code, "message": message})
        return events + [self._event("response.failed", response=self._final)]

    def response(self) -> dict:
        """The non-streaming body: the Response of the last event, after :meth:`finish`."""
        assert self._final is not None, "finish() first"
        return self._final

    def _response(self, status: str, *, usage: dict | None = None, incomplete_details: dict | None = None,
                  error: dict | None = None, completed_at: int | None = None) -> dict:
        output = [dict(item) for item in self._output] if status != "in_progress" else []
        return {"id": self.response_id, "object": "response", "created_at": self.created_at, "status": status,
                "completed_at": completed_at, "error": error, "incomplete_details": incomplete_details,
                "model": self.model, "output": output, "usage": usage, "store": False, "background": False,
                "truncation": "disabled", "service_tier": "default", "previous_response_id": None,
                **self.echo}

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _text(self, kind: str, text: str) -> list[dict]:
        """Events adding ``text`` to the open reasoning or message item (opening one if needed)."""
        events: list[dict] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close("completed")
            if kind == "reasoning":
                events += self._begin({"id": _item_id("rs"), "type": "reasoning", "summary": [], "content": [],
                                       "status": "in_progress"})
                part = {"type": "reasoning_text", "text": ""}
            else:
                events += self._begin({"id": _item_id("msg"), "type": "message", "role": "assistant",
                                       "status": "in_progress", "content": []})
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            assert self._open is not None
            self._open["content"].append(part)
            events.append(self._event("response.content_part.added", item_id=self._open["id"],
                                      output_index=len(self._output), content_index=0, part=dict(part)))
        assert self._open is not None
        self._open["content"][0]["text"] += text
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        events.append(self._event(name, item_id=self._open["id"], output_index=len(self._output), content_index=0,
                                  delta=text, **extra))
        return events

    def _begin(self, item: dict) -> list[dict]:
        self._open = item
        return [self._event("response.output_item.added", output_index=len(self._output), item=_copy(item))]

    def _close(self, status: str) -> list[dict]:
        item = self._open
        if item is None:
            return []
        index = len(self._output)
        events: list[dict] = []
        if item["type"] == "function_call":
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, name=item["name"], arguments=item["arguments"]))
        else:
            part = item["content"][0]
            name = "response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done"
            extra = {} if item["type"] == "reasoning" else {"logprobs": []}
            events.append(self._event(name, item_id=item["id"], output_index=index, content_index=0,
                                      text=part["text"], **extra))
            events.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                      content_index=0, part=dict(part)))
        item["status"] = status
        self._output.append(item)
        self._open = None
        events.append(self._event("response.output_item.done", output_index=index, item=_copy(item)))
        return events


def _copy(item: dict) -> dict:
    """An item as it stands now (its content parts copied: the open item keeps growing)."""
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(part) for part in out["content"]]
    return out
