"""Server-sent events framing as OpenAI streams it: ``data: <json>\\n\\n`` ... ``data: [DONE]\\n\\n``.

Each event is a single ``data:`` line; :func:`to_json_bytes` guarantees the
JSON holds no line break of any kind. :func:`parse_sse` is a deliberately
strict reader of exactly this framing, for tests and clients of our own.
"""

from __future__ import annotations

from kestrel_trio.errors import KestrelError, error_object
from kestrel_trio.openai.response.bodies import to_json_bytes

__all__ = ["SSE_DONE", "sse_event", "sse_error", "parse_sse", "SSEFormatError"]

SSE_DONE = b"data: [DONE]\n\n"
_PREFIX = "data: "


class SSEFormatError(ValueError):
    """A byte stream that is not the exact ``data: ...\\n\\n`` framing."""


def sse_event(obj: dict) -> bytes:
    """One SSE event carrying ``obj`` as one-line JSON."""
    return b"data: " + to_json_bytes(obj) + b"\n\n"


def sse_error(
    error: KestrelError | str,
    error_type: str = "server_error",
    param: str | None = None,
    code: str | None = None,
) -> bytes:
    """An SSE event carrying an OpenAI error envelope ``{"error": {...}}``.

    Args:
        error: a :class:`KestrelError` (its type, param and code are used and the
            other arguments ignored), or a message string.
        error_type: the OpenAI error ``type`` when ``error`` is a string.
        param: the field at fault when ``error`` is a string.
        code: the error code when ``error`` is a string.
    """
    if isinstance(error, KestrelError):
        return sse_event(error_object(error.message, error.error_type, error.param, error.code))
    return sse_event(error_object(error, error_type, param, code))


def parse_sse(data: bytes) -> list[str]:
    """Split a complete SSE byte stream into its ``data`` payloads.

    Accepts only events made of exactly one ``data: <payload>`` line, each
    ended by a blank line, in UTF-8 without carriage returns.

    Raises:
        SSEFormatError: anything else (comments, other fields, CR, a
            truncated last event, invalid UTF-8).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SSEFormatError(f"SSE stream is not UTF-8: {exc}") from None
    if "\r" in text:
        raise SSEFormatError("SSE stream contains a carriage return")
    if not text:
        return []
    if not text.endswith("\n\n"):
        raise SSEFormatError("SSE stream does not end with a blank line")
    payloads = []
    for event in text[:-2].split("\n\n"):
        if "\n" in event:
            raise SSEFormatError(f"SSE event spans several lines: {event!r}")
        if not event.startswith(_PREFIX):
            raise SSEFormatError(f"SSE event is not a 'data: ' line: {event!r}")
        payloads.append(event[len(_PREFIX):])
    return payloads
