"""Response bodies in exactly OpenAI's shapes, plus the one JSON serializer.

Streaming chunks take ``include_usage``: when the client asked for
``stream_options.include_usage``, OpenAI sends ``"usage": null`` on every
chunk and a final chunk with empty ``choices`` carrying the usage.
"""

from __future__ import annotations

import json
import secrets

import attrs

__all__ = [
    "Usage",
    "usage_dict",
    "new_id",
    "to_json_bytes",
    "chat_completion",
    "chat_chunk_role",
    "chat_chunk_delta",
    "chat_chunk_finish",
    "chat_chunk_usage",
    "completion",
    "completion_chunk",
    "completion_chunk_usage",
    "model_card",
    "models_list",
]

# Characters that json.dumps(ensure_ascii=False) leaves raw but that
# str.splitlines()-based line readers treat as line breaks.
_LINE_BREAKERS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


@attrs.frozen
class Usage:
    """Token counts of one request.

    Attributes:
        prompt_tokens: tokens in the prompt.
        completion_tokens: tokens generated.
    """

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        """prompt_tokens + completion_tokens."""
        return self.prompt_tokens + self.completion_tokens


def usage_dict(usage: Usage, cached_tokens: int | None = None) -> dict:
    """OpenAI's ``usage`` object; ``prompt_tokens_details.cached_tokens`` only when given."""
    out: dict = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def new_id(prefix: str) -> str:
    """A fresh response id such as ``chatcmpl-<24 hex digits>`` (96 random bits)."""
    return f"{prefix}-{secrets.token_hex(12)}"


def to_json_bytes(obj: object) -> bytes:
    """Compact UTF-8 JSON on one line.

    Besides the escapes json.dumps always makes (``\\n``, ``\\r`` ...), U+2028,
    U+2029 and U+0085 are escaped too so no line reader can split the result.
    They can only occur inside JSON strings, where the escape is equivalent.
    """
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for raw, escaped in _LINE_BREAKERS.items():
        if raw in text:
            text = text.replace(raw, escaped)
    return text.encode("utf-8")


def _chat_envelope(id: str, created: int, model: str, choices: list, include_usage: bool) -> dict:
    out = {"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}
    if include_usage:
        out["usage"] = None
    return out


def chat_completion(
    id: str,
    created: int,
    model: str,
    content: str | None,
    reasoning_content: str | None,
    finish_reason: str,
    usage: Usage,
    *,
    cached_tokens: int | None = None,
) -> dict:
    """A non-streaming ``chat.completion`` body with one choice.

    Args:
        id: the response id (``chatcmpl-...``).
        created: Unix time of creation, seconds.
        model: the model id to report.
        content: the answer text (None when the answer is only tool calls).
        reasoning_content: the reasoning text; the key is omitted when None.
        finish_reason: ``"stop"``, ``"length"``, ...
        usage: token counts.
        cached_tokens: prompt tokens served from a prefix cache, if known.
    """
    message: dict = {"role": "assistant", "content": content}
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage_dict(usage, cached_tokens),
    }


def chat_chunk_role(id: str, created: int, model: str, *, include_usage: bool = False) -> dict:
    """The first streaming chunk: ``delta`` ``{"role": "assistant", "content": ""}``."""
    return chat_chunk_delta(id, created, model, content="", include_usage=include_usage, role="assistant")


def chat_chunk_delta(
    id: str,
    created: int,
    model: str,
    content: str | None = None,
    reasoning_content: str | None = None,
    *,
    include_usage: bool = False,
    role: str | None = None,
) -> dict:
    """A streaming chunk whose ``delta`` holds only the keys given (not None)."""
    delta: dict = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if reasoning_content is not None:
        delta["reasoning_content"] = reasoning_content
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    return _chat_envelope(id, created, model, [choice], include_usage)


def chat_chunk_finish(id: str, created: int, model: str, finish_reason: str, *, include_usage: bool = False) -> dict:
    """The streaming chunk that ends the choice: empty ``delta`` and the ``finish_reason``."""
    choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}
    return _chat_envelope(id, created, model, [choice], include_usage)


def chat_chunk_usage(id: str, created: int, model: str, usage: Usage, *, cached_tokens: int | None = None) -> dict:
    """The last streaming chunk when ``include_usage`` is on: no choices, the usage."""
    out = _chat_envelope(id, created, model, [], include_usage=False)
    out["usage"] = usage_dict(usage, cached_tokens)
    return out


def completion(
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: Usage,
    *,
    cached_tokens: int | None = None,
) -> dict:
    """A non-streaming ``text_completion`` body with one choice (times in Unix seconds)."""
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage_dict(usage, cached_tokens),
    }


def completion_chunk(
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None = None,
    *,
    include_usage: bool = False,
) -> dict:
    """A streaming ``text_completion`` chunk; the last one carries ``finish_reason``."""
    out = {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}],
    }
    if include_usage:
        out["usage"] = None
    return out


def completion_chunk_usage(id: str, created: int, model: str, usage: Usage, *, cached_tokens: int | None = None) -> dict:
    """The last streaming completion chunk when ``include_usage`` is on: no choices, the usage."""
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_dict(usage, cached_tokens),
    }


def model_card(model_id: str, created: int, owned_by: str = "kestrel-trio", *, max_model_len: int | None = None) -> dict:
    """One ``model`` object; ``max_model_len`` (a vLLM extension, tokens) only when given."""
    card: dict = {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    return card


def models_list(model_ids: list[str] | tuple[str, ...], created: int, owned_by: str = "kestrel-trio") -> dict:
    """The ``GET /v1/models`` body (``created`` in Unix seconds)."""
    return {"object": "list", "data": [model_card(model_id, created, owned_by) for model_id in model_ids]}
