"""Ollama's response shapes: NDJSON chunks, final statistics, model listings, the error body (no trio/numpy).

A stream is newline-delimited JSON (``application/x-ndjson``): one object per line, each with ``model``,
``created_at`` (RFC 3339, UTC) and ``done``; the last one has ``done: true``, ``done_reason`` ("stop",
"length", or "load" for an empty ``/api/generate``) and the timings Ollama reports, in nanoseconds:
``total_duration`` (request received to last token), ``load_duration`` (0: the model is loaded at start),
``prompt_eval_count`` / ``prompt_eval_duration`` (prompt tokens, and until the first new token), and
``eval_count`` / ``eval_duration`` (new tokens, and from the first to the last).
"""

from __future__ import annotations

import datetime
import json

import attrs

__all__ = ["NDJSON", "ndjson_line", "created_at", "Timings", "chat_chunk", "generate_chunk", "final_fields",
           "error_body", "tool_calls", "OLLAMA_VERSION"]

NDJSON = "application/x-ndjson"
OLLAMA_VERSION = "0.12.0"  # the Ollama release whose API shapes these routes follow (clients gate features on it)


def ndjson_line(obj: dict) -> bytes:
    """One NDJSON line."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def created_at(now: datetime.datetime | None = None) -> str:
    """``created_at``: the current time in RFC 3339 with nanosecond-style precision, UTC."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@attrs.define
class Timings:
    """What the final chunk reports; times in nanoseconds from any monotonic clock (only differences count).

    Attributes:
        started: when the request was received.
        first_token: when the first new token arrived (None: none yet).
        last_token: when the last one arrived.
        prompt_tokens: tokens in the prompt.
        completion_tokens: tokens generated.
    """

    started: int
    first_token: int | None = None
    last_token: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def token(self, now: int, prompt_tokens: int, completion_tokens: int) -> None:
        """A new token arrived at ``now`` (ns); the counts are the engine's so far."""
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens


def final_fields(done_reason: str, timings: Timings, now: int) -> dict:
    """The fields that end a response: ``done``, ``done_reason`` and the statistics (ns)."""
    first = timings.first_token if timings.first_token is not None else now
    last = timings.last_token if timings.last_token is not None else now
    return {"done": True, "done_reason": done_reason, "total_duration": max(0, now - timings.started),
            "load_duration": 0, "prompt_eval_count": timings.prompt_tokens,
            "prompt_eval_duration": max(0, first - timings.started), "eval_count": timings.completion_tokens,
            "eval_duration": max(0, last - first)}


def tool_calls(calls: list[dict]) -> list[dict]:
    """OpenAI ``tool_calls`` (arguments as JSON text) in Ollama's shape (arguments as an object)."""
    out = []
    for index, call in enumerate(calls):
        function = call["function"]
        out.append({"id": call["id"], "function": {"index": index, "name": function["name"],
                                                   "arguments": json.loads(function["arguments"] or "{}")}})
    return out


def chat_chunk(model: str, content: str = "", thinking: str = "", calls: list[dict] | None = None) -> dict:
    """One ``/api/chat`` object before the last: the new text (and reasoning, and whole tool calls)."""
    message: dict = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = tool_calls(calls)
    return {"model": model, "created_at": created_at(), "message": message, "done": False}


def generate_chunk(model: str, response: str = "", thinking: str = "") -> dict:
    """One ``/api/generate`` object before the last."""
    out: dict = {"model": model, "created_at": created_at(), "response": response}
    if thinking:
        out["thinking"] = thinking
    out["done"] = False
    return out


def error_body(message: str) -> bytes:
    """Ollama's error body, ``{"error": "..."}``."""
    return json.dumps({"error": message}, ensure_ascii=False).encode()
