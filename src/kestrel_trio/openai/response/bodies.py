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
    "chat_completion_of",
    "chat_chunk",
    "completion_of",
    "completion_chunk_of",
    "chat_chunk_usage",
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
        cached_tokens: prompt tokens served from the prefix cache, if known.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        """prompt_tokens + completion_tokens."""
        return self.prompt_tokens + self.completion_tokens


def usage_dict(usage: Usage) -> dict:
    """OpenAI's ``usage`` object; ``prompt_tokens_details.cached_tokens`` only when known."""
    out: dict = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
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










def chat_chunk_usage(id: str, created: int, model: str, usage: Usage) -> dict:
    """The last streaming chunk when ``include_usage`` is on: no choices, the usage."""
    out = _chat_envelope(id, created, model, [], include_usage=False)
    out["usage"] = usage_dict(usage)
    return out






def completion_chunk_usage(id: str, created: int, model: str, usage: Usage) -> dict:
    """The last streaming completion chunk when ``include_usage`` is on: no choices, the usage."""
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_dict(usage),
    }


def model_card(model_id: str, created: int, owned_by: str = "kestrel-trio", *, max_model_len: int | None = None,
               input_modalities: tuple[str, ...] | None = None, sampling_defaults: dict | None = None) -> dict:
    """One ``model`` object.

    Extensions, each only when given: ``max_model_len`` (vLLM's, tokens),
    ``input_modalities`` (e.g. ``["text", "image"]``, as OpenRouter names it),
    which tells a client such as the built-in chat page whether to offer images,
    and ``sampling_defaults``, what a chat request gets for each sampling field
    it leaves out (``temperature``, ``top_p``, ``top_k``, ``min_p``,
    ``repetition_penalty``, ``max_tokens``: null for up to the context,
    ``repetition_guard``: null or ``{"window", "repeats"}``), which the page shows.
    """
    card: dict = {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    if input_modalities is not None:
        card["input_modalities"] = list(input_modalities)
    if sampling_defaults is not None:
        card["sampling_defaults"] = dict(sampling_defaults)
    return card


def models_list(model_ids: list[str] | tuple[str, ...], created: int, owned_by: str = "kestrel-trio", *,
                max_model_len: int | None = None, input_modalities: tuple[str, ...] | None = None,
                sampling_defaults: dict | None = None) -> dict:
    """The ``GET /v1/models`` body (``created`` in Unix seconds; the extensions as in :func:`model_card`)."""
    return {"object": "list", "data": [model_card(model_id, created, owned_by, max_model_len=max_model_len,
                                                  input_modalities=input_modalities,
                                                  sampling_defaults=sampling_defaults)
                                       for model_id in model_ids]}


def chat_completion_of(id: str, created: int, model: str, choices: list[dict], usage: Usage) -> dict:
    """A non-streaming ``chat.completion`` body with prepared ``choices`` (Unix seconds)."""
    return {"id": id, "object": "chat.completion", "created": created, "model": model, "choices": choices,
            "usage": usage_dict(usage)}


def chat_chunk(id: str, created: int, model: str, choices: list[dict], *, include_usage: bool = False) -> dict:
    """A ``chat.completion.chunk`` with prepared ``choices`` items."""
    return _chat_envelope(id, created, model, choices, include_usage)


def completion_of(id: str, created: int, model: str, choices: list[dict], usage: Usage) -> dict:
    """A non-streaming ``text_completion`` body with prepared ``choices``."""
    return {"id": id, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": usage_dict(usage)}


def completion_chunk_of(id: str, created: int, model: str, choices: list[dict], *, include_usage: bool = False) -> dict:
    """A streaming ``text_completion`` chunk with prepared ``choices`` items."""
    out = {"id": id, "object": "text_completion", "created": created, "model": model, "choices": choices}
    if include_usage:
        out["usage"] = None
    return out
