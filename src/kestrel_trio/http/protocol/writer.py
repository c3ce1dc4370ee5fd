"""Writing responses through h11: plain, streamed and error responses."""

from __future__ import annotations

import contextlib
import logging
from typing import AsyncIterator

import h11
import trio

from kestrel_trio.http.protocol.exchange import Exchange
from kestrel_trio.http.protocol.transport import Transport
from kestrel_trio.http.protocol.wire import response_head
from kestrel_trio.http.responses import internal_error_response
from kestrel_trio.http.types import Response, StreamingResponse

__all__ = ["ResponseWriter"]

_log = logging.getLogger("kestrel_trio.http")
_CLOSE = (("connection", "close"),)
_Headers = tuple[tuple[str, str], ...]


class ResponseWriter:
    """Send responses on one connection.

    Args:
        connection: the connection's h11 state machine.
        transport: the connection's socket.
        shutting_down: once set, every response says ``Connection: close``.

    Attributes:
        quiet: set when the peer left; a failing stream is then not logged.
        extra_headers: added to every response head of the current exchange
            (the CORS headers of its request); the connection sets them per request.
    """

    def __init__(self, connection: h11.Connection, transport: Transport, shutting_down: trio.Event) -> None:
        self._h11 = connection
        self._transport = transport
        self._shutting_down = shutting_down
        self.quiet = False
        self.extra_headers: _Headers = ()

    async def send_event(self, event: h11.Event) -> None:
        """Serialize ``event`` with h11 and send it."""
        data = self._h11.send(event)
        if data:
            await self._transport.send(data)

    async def send_response(self, response: Response, method: str, exchange: Exchange, close: bool = False) -> None:
        """Send a complete response (a 500 instead if its head is unsendable)."""
        body = response.body if response.status not in (204, 304) else b""
        # A 204 has no body and may not say how long it is (RFC 9110 8.6).
        framing = (("content-length", str(len(body))),) if response.status != 204 else ()
        head = self._head(response.status, response.headers, response.content_type, framing, close)
        if head is None:
            await self.send_response(internal_error_response(), method, exchange, close)
            return
        # One socket send for head, body and end: a small response costs one syscall.
        data = self._h11.send(head)
        if body and method != "HEAD":
            data += self._h11.send(h11.Data(data=body))
            exchange.bytes_out += len(body)
        data += self._h11.send(h11.EndOfMessage())
        exchange.status = response.status
        await self._transport.send(data)
        exchange.completed = True

    async def send_streaming(self, response: StreamingResponse, method: str, exchange: Exchange) -> bool:
        """Send a streamed response chunk by chunk, always closing its generator.

        Returns:
            False if the generator failed after the head was sent: the body is
            then unterminated and the connection must be aborted.
        """
        headers = response.headers
        if not any(name.lower() == "cache-control" for name, _ in headers):
            headers += (("cache-control", "no-cache"),)
        # The producer is created and closed on every path, even when no body is sent, so that
        # whatever it holds (a queued generation) is released.
        async with _closing(response.chunks()) as chunks:
            head = self._head(response.status, headers, response.content_type, (), close=False)
            if head is None:
                await self.send_response(internal_error_response(), method, exchange)
                return True
            await self.send_event(head)
            exchange.status = response.status
            if method != "HEAD" and not await self._send_chunks(chunks, exchange):
                return False
        await self.send_event(h11.EndOfMessage())
        exchange.completed = True
        return True

    async def _send_chunks(self, chunks: AsyncIterator[bytes], exchange: Exchange) -> bool:
        """Send each chunk as soon as it is produced; False if the producer failed."""
        while True:
            try:
                chunk = await chunks.__anext__()
                if not isinstance(chunk, (bytes, bytearray, memoryview)):
                    raise TypeError(f"streamed chunks must be bytes, not {type(chunk).__name__}")
            except StopAsyncIteration:
                return True
            except Exception as exc:
                if not self.quiet:
                    _log.error("streaming response failed after its head was sent", exc_info=exc)
                return False
            if chunk:
                await self.send_event(h11.Data(data=bytes(chunk)))
                exchange.bytes_out += len(chunk)

    def _head(
        self, status: int, headers: _Headers, content_type: str, framing: _Headers, close: bool
    ) -> h11.Response | None:
        if close or self._shutting_down.is_set():
            framing += _CLOSE
        headers += self.extra_headers
        try:
            return response_head(status, headers, content_type, framing)
        except (h11.LocalProtocolError, UnicodeError, TypeError, ValueError) as exc:
            _log.error("request handler produced an unsendable response head: %r", exc)
            return None


@contextlib.asynccontextmanager
async def _closing(chunks: AsyncIterator[bytes]):
    """Close an async generator however the block ends, so its ``finally`` runs."""
    try:
        yield chunks
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
