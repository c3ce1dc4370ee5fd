"""Values exchanged between the HTTP server and its handler."""

from __future__ import annotations

from typing import AsyncIterator, Awaitable, Callable, Union

import attrs

__all__ = ["Request", "Response", "StreamingResponse", "Handler", "ImmediateAnswer", "Immediate", "Route"]


@attrs.frozen
class Request:
    """One fully received HTTP request.

    Attributes:
        method: the request method, e.g. ``"GET"``.
        path: the request target without its query string, e.g. ``"/v1/models"``
            (not percent-decoded).
        query: the raw query string without ``?``; ``""`` if none.
        headers: ``(name, value)`` pairs in arrival order; names lower-cased,
            both latin-1 decoded.
        body: the whole request body (chunked bodies already de-chunked).
        client: the peer address as ``"host:port"``.
    """

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    client: str

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        wanted = name.lower()
        for key, value in self.headers:
            if key == wanted:
                return value
        return None


@attrs.frozen
class Response:
    """A complete response; the server adds ``Content-Length`` and ``Server``.

    Attributes:
        status: the HTTP status code (200-599).
        body: the body bytes.
        headers: extra ``(name, value)`` pairs. Framing headers
            (``Content-Length``, ``Transfer-Encoding``) are the server's and
            are dropped from here.
        content_type: the ``Content-Type``, unless ``headers`` carries one;
            ``""`` for none (e.g. a 204).
    """

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str = "application/json"


@attrs.frozen
class StreamingResponse:
    """A response whose body is produced while it is sent (e.g. SSE).

    The server sends it with chunked transfer encoding (close-delimited for
    HTTP/1.0 clients) and ``Cache-Control: no-cache``, writing each chunk as
    soon as it is yielded. The generator is always closed (its ``finally``
    runs): at the end, when the client disconnects, when a write stalls past
    ``write_timeout`` and when the shutdown grace expires. In the last three
    cases it sees ``trio.Cancelled`` (or ``GeneratorExit``) at its current
    ``await``/``yield``. Anything else it raises is logged and the connection is
    closed without the terminating chunk, so the client sees a truncated body;
    errors meant for the client must be written into the stream by the
    generator itself.

    Attributes:
        status: the HTTP status code.
        chunks: an async generator function (called with no arguments) that
            yields the body chunks, as bytes.
        headers: extra ``(name, value)`` pairs.
        content_type: the ``Content-Type``, unless ``headers`` carries one.
    """

    status: int
    chunks: Callable[[], AsyncIterator[bytes]]
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str = "text/event-stream"


# The handler runs in the connection's task, inside a cancel scope that the
# server cancels when the client goes away (EOF or reset) or when the shutdown
# grace expires: an abandoned request shows up in the handler as trio.Cancelled.
# A KestrelError it raises becomes that error's status and OpenAI envelope; any
# other exception is logged and becomes a generic 500.
Handler = Callable[[Request], Awaitable[Union[Response, StreamingResponse]]]
# A synchronous answer for a request served from memory (health probes, static files): it never waits.
ImmediateAnswer = Callable[[Request], Response]


@attrs.frozen
class Immediate:
    """A route answered from memory: the server calls ``answer(request)`` and sends its Response at once,
    without starting the disconnect watcher, since nothing long runs."""

    answer: ImmediateAnswer


# What a request's head resolves to, once: a Response (a refusal: 401, 404, 405, 415, a CORS preflight),
# an Immediate answer, or the Handler to run with the whole request. A handler object may offer
# ``route(request) -> Route``; the server then calls it once per request (before the body when the
# client waits on ``Expect: 100-continue``, so a refusal spares the body) and never calls the object
# itself. A plain Handler function is its own route.
Route = Union[Response, Immediate, Handler]
