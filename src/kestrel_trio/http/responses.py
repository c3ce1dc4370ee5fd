"""Responses the HTTP layer produces itself: OpenAI error envelopes."""

from __future__ import annotations

import logging
import math

from kestrel_trio.errors import KestrelError, error_body, error_body_for
from kestrel_trio.http.types import Response

__all__ = [
    "error_response", "retry_after_header", "kestrel_error_response", "response_for_exception",
    "internal_error_response",
]

_log = logging.getLogger("kestrel_trio.http")


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    error_type: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> Response:
    """An OpenAI error envelope as a JSON :class:`Response`.

    Args:
        status: the HTTP status code.
        message: the human-readable ``error.message``.
        code: the machine-readable ``error.code``.
        error_type: the ``error.type``; by default ``invalid_request_error``
            for 4xx and ``server_error`` for 5xx.
        headers: extra response headers.
    """
    if error_type is None:
        error_type = "invalid_request_error" if status < 500 else "server_error"
    return Response(status=status, body=error_body(message, error_type, None, code), headers=headers)


def retry_after_header(seconds: float | None) -> tuple[tuple[str, str], ...]:
    """A ``Retry-After`` header for ``seconds`` rounded up, or nothing for None."""
    if seconds is None:
        return ()
    return (("retry-after", str(max(0, math.ceil(seconds)))),)


def kestrel_error_response(exc: KestrelError, body: bytes) -> Response:
    """``body`` (an API's error envelope for ``exc``) with ``exc``'s status, and ``Retry-After`` when it has one.

    A status outside 400..599 is sent as 500.
    """
    status = exc.status if 400 <= exc.status <= 599 else 500
    return Response(status=status, body=body, headers=retry_after_header(getattr(exc, "retry_after", None)))


def response_for_exception(exc: Exception) -> Response:
    """Translate an exception a handler raised into the response to send.

    A :class:`KestrelError` keeps its status and message (plus ``Retry-After``
    when it has a ``retry_after``); anything else is logged with its traceback
    and becomes a 500 that reveals nothing about it.
    """
    exc = _sole_leaf(exc)
    if isinstance(exc, KestrelError):
        return kestrel_error_response(exc, error_body_for(exc))
    _log.error("request handler failed", exc_info=exc)
    return internal_error_response()


def _sole_leaf(exc: Exception) -> Exception:
    """The one exception inside (nested) single-member exception groups, else ``exc``.

    A handler that raises from inside its own nursery wraps the error in a group.
    """
    while True:
        members = getattr(exc, "exceptions", None)
        if not (isinstance(members, tuple) and len(members) == 1 and isinstance(members[0], Exception)):
            return exc
        exc = members[0]


def internal_error_response() -> Response:
    """The generic 500 response."""
    return error_response(500, "The server had an error while processing your request.", code="internal_error")
