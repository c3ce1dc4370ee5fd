"""The one error family of kestrel-trio.

Every error that crosses the public API is a :class:`KestrelError`. Each class
carries an HTTP status hint and an OpenAI error ``type`` so that the HTTP layer
can translate any of them into an OpenAI error envelope without knowing where
it came from. The OpenAI error envelope (``{"error": {"message", "type",
"param", "code"}}``) is built here too, beside the family it renders, so the
HTTP layer can answer in it without importing the OpenAI layer. This module
imports nothing but the standard library so that every layer (``_model``
included) may raise these.
"""

from __future__ import annotations

import json

__all__ = [
    "KestrelError",
    "ModelLoadError",
    "BadRequestError",
    "ContextLengthError",
    "QueueFullError",
    "EngineUnavailableError",
    "AuthenticationError",
    "ModelNotFoundError",
    "OutOfMemoryError",
    "error_object",
    "error_body",
    "error_body_for",
]


class KestrelError(Exception):
    """Base class of every kestrel-trio error.

    Attributes:
        status: the HTTP status a server would answer with.
        error_type: the OpenAI error ``type`` string.
        param: the request field at fault, if any.
        code: a short machine-readable code, if any.
    """

    status: int = 500
    error_type: str = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ModelLoadError(KestrelError):
    """A checkpoint folder cannot be loaded; the message names the file, field or tensor."""

    status = 500
    error_type = "model_load_error"


class BadRequestError(KestrelError):
    """A request is invalid; ``param`` names the field at fault."""

    status = 400
    error_type = "invalid_request_error"


class ContextLengthError(BadRequestError):
    """A prompt (plus max_tokens) does not fit the model's context window."""

    def __init__(self, message: str, *, param: str | None = "messages", code: str | None = "context_length_exceeded") -> None:
        super().__init__(message, param=param, code=code)


class QueueFullError(KestrelError):
    """The engine's bounded queue is full; retry after ``retry_after`` seconds."""

    status = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: float, code: str | None = "queue_full") -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class EngineUnavailableError(KestrelError):
    """The engine is loading, shutting down or broken."""

    status = 503
    error_type = "server_error"

    def __init__(self, message: str, *, retry_after: float | None = None, code: str | None = "unavailable") -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class OutOfMemoryError(KestrelError):
    """A model step could not get the memory this generation needed; the server goes on serving the others."""

    status = 503
    error_type = "server_error"

    def __init__(self, message: str, *, retry_after: float | None = 5, code: str | None = "out_of_memory") -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class AuthenticationError(KestrelError):
    """A request lacks the server's API key, or carries a wrong one (401)."""

    status = 401
    error_type = "invalid_request_error"


class ModelNotFoundError(KestrelError):
    """A request names a model this server does not serve (404)."""

    status = 404
    error_type = "invalid_request_error"


def error_object(message: str, error_type: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error envelope as a dict."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_body(message: str, error_type: str, param: str | None = None, code: str | None = None) -> bytes:
    """The OpenAI error envelope as UTF-8 JSON bytes."""
    return json.dumps(error_object(message, error_type, param, code), ensure_ascii=False).encode("utf-8")


def error_body_for(exc: KestrelError) -> bytes:
    """The OpenAI error envelope for a :class:`KestrelError`."""
    return error_body(exc.message, exc.error_type, exc.param, exc.code)
