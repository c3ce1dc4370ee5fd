"""Timeouts and size limits of the HTTP server."""

from __future__ import annotations

import attrs

__all__ = ["HttpLimits"]


@attrs.frozen
class HttpLimits:
    """Every deadline and size bound the HTTP server enforces.

    Attributes:
        header_timeout: seconds allowed to receive a whole request head, counted
            from accept (first request) or from the first byte of the next
            request (keep-alive). Exceeded -> 408, then close.
        body_timeout: seconds allowed to receive the whole body once the head
            is in. Exceeded -> 408, then close.
        keepalive_timeout: seconds a keep-alive connection may stay idle
            between requests before it is closed quietly.
        write_timeout: seconds a send may make no progress before the client
            is cut off (the connection is aborted).
        max_header_bytes: largest request head, in bytes. Exceeded -> 431.
        max_body_bytes: largest request body, in bytes. Exceeded -> 413.
        max_connections: most connections served at once; one more gets 503
            with ``Retry-After`` and ``Connection: close``. Each costs a file
            descriptor: the process's open-files limit must be above it.
        shutdown_grace: seconds in-flight requests get after
            :meth:`HttpServer.begin_shutdown` before they are cancelled.
        linger_timeout: seconds spent draining a connection after the server
            half-closed it, so the client reads the last response instead of a
            reset.
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keepalive_timeout: float = 5.0
    write_timeout: float = 30.0
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 4 * 1024 * 1024
    max_connections: int = 1000
    shutdown_grace: float = 10.0
    linger_timeout: float = 1.0
