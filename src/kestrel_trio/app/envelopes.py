"""Handlers whose refusals are in their API's error envelope rather than OpenAI's.

The router's own handler answers a :class:`KestrelError` in OpenAI's envelope; a route of another API
(Anthropic, Ollama) is wrapped by :func:`errors_as` with that API's translation instead.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from kestrel_trio.errors import KestrelError
from kestrel_trio.http import Request, Response, StreamingResponse

__all__ = ["errors_as"]

Handler = Callable[..., Awaitable[Response | StreamingResponse]]


def errors_as(to_response: Callable[[KestrelError], Response]) -> Callable[[Handler], Handler]:
    """A decorator for a handler method ``(self, request)``: a KestrelError it raises becomes ``to_response(exc)``.

    Only errors raised before the answer is returned are caught; a stream that has begun reports its own.
    """
    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def wrapped(self, request: Request) -> Response | StreamingResponse:
            try:
                return await handler(self, request)
            except KestrelError as exc:
                return to_response(exc)
        return wrapped
    return decorate
