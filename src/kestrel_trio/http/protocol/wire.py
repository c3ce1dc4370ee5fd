"""Conversions between h11 events and the HTTP layer's value types."""

from __future__ import annotations

from http import HTTPStatus

import h11

from kestrel_trio.http.types import Request

__all__ = [
    "SERVER_NAME",
    "SUPPORTED_VERSIONS",
    "to_request",
    "declared_length",
    "head_size",
    "response_head",
]

SERVER_NAME = "kestrel-trio"
SUPPORTED_VERSIONS = (b"1.0", b"1.1")
# Framing belongs to the server; a handler's own copy would contradict it.
_SERVER_OWNED = frozenset({"content-length", "transfer-encoding", "server"})


def to_request(event: h11.Request, body: bytes, client: str) -> Request:
    """Build a :class:`Request` from h11's head ``event`` and the received ``body``."""
    target = event.target.decode("latin-1")
    if target.startswith(("http://", "https://")):
        # absolute-form: drop scheme and authority
        slash = target.find("/", target.index("//") + 2)
        target = "/" if slash < 0 else target[slash:]
    path, _, query = target.partition("?")
    headers = tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers)
    return Request(
        method=event.method.decode("latin-1"),
        path=path,
        query=query,
        headers=headers,
        body=body,
        client=client,
    )


def declared_length(event: h11.Request) -> int | None:
    """The request's Content-Length in bytes, or None without one (h11 validated it)."""
    for name, value in event.headers:
        if name == b"content-length":
            return int(value)
    return None


def head_size(event: h11.Request) -> int:
    """A lower bound on the bytes the request head took on the wire.

    h11 only enforces its size limit on heads that arrive incomplete; a large
    head that arrives in one read must be measured after parsing.
    """
    request_line = len(event.method) + len(event.target) + len(b"  HTTP/1.1\r\n")
    fields = sum(len(name) + len(value) + len(b": \r\n") for name, value in event.headers)
    return request_line + fields + len(b"\r\n")


def response_head(
    status: int,
    headers: tuple[tuple[str, str], ...],
    content_type: str,
    framing: tuple[tuple[str, str], ...],
) -> h11.Response:
    """The h11 response head for a handler's response.

    Args:
        status: the status code (200-999).
        headers: the handler's extra headers; framing ones are dropped.
        content_type: used unless ``headers`` has a Content-Type; ``""`` sends none.
        framing: headers the server adds (Content-Length, Connection, ...).

    Raises:
        h11.LocalProtocolError: a status or header h11 refuses to send.
        UnicodeError: a header that is not latin-1 text.
    """
    encoded = [(b"server", SERVER_NAME.encode("ascii"))]
    has_content_type = False
    for name, value in headers:
        lowered = name.lower()
        if lowered in _SERVER_OWNED:
            continue
        has_content_type = has_content_type or lowered == "content-type"
        encoded.append((name.encode("ascii"), value.encode("latin-1")))
    if not has_content_type and content_type:
        encoded.append((b"content-type", content_type.encode("latin-1")))
    encoded.extend((name.encode("ascii"), value.encode("latin-1")) for name, value in framing)
    return h11.Response(status_code=status, headers=encoded, reason=_reason(status))


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""
