"""The access-log record of one request/response exchange."""

from __future__ import annotations

import logging

import attrs
import trio

__all__ = ["Exchange", "CLIENT_CLOSED"]

CLIENT_CLOSED = 499  # logged status of a request its client abandoned


@attrs.define
class Exchange:
    """What the access log records about one request.

    Attributes:
        client: the peer as ``"host:port"``.
        started: trio time (s) the request's first byte was waited for.
        method: the request method, ``"-"`` until the head parsed.
        path: the request path, ``"-"`` until the head parsed.
        status: the status sent, 0 while none was.
        bytes_out: body bytes sent.
        completed: the whole response was sent.
    """

    client: str
    started: float = attrs.field(factory=trio.current_time)
    method: str = "-"
    path: str = "-"
    status: int = 0
    bytes_out: int = 0
    completed: bool = False

    def log(self, access_log: logging.Logger) -> None:
        """Write the one INFO line of this exchange, unless nothing was answered."""
        if self.status == 0 or not access_log.isEnabledFor(logging.INFO):
            return
        duration_ms = (trio.current_time() - self.started) * 1000.0
        access_log.info(
            '%s "%s %s" %d %d %.1fms',
            self.client,
            self.method,
            self.path,
            self.status,
            self.bytes_out,
            duration_ms,
            extra={
                "http_method": self.method,
                "http_path": self.path,
                "http_status": self.status,
                "http_bytes_out": self.bytes_out,
                "http_duration_ms": duration_ms,
                "http_client": self.client,
            },
        )
