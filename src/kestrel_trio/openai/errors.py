"""OpenAI error envelopes: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json

from kestrel_trio.errors import KestrelError

__all__ = ["error_object", "error_body", "error_body_for"]


def error_object(message: str, error_type: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error envelope as a dict."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_body(message: str, error_type: str, param: str | None = None, code: str | None = None) -> bytes:
    """The OpenAI error envelope as UTF-8 JSON bytes."""
    return json.dumps(error_object(message, error_type, param, code), ensure_ascii=False).encode("utf-8")


def error_body_for(exc: KestrelError) -> bytes:
    """The OpenAI error envelope for a :class:`KestrelError`."""
    return error_body(exc.message, exc.error_type, exc.param, exc.code)
