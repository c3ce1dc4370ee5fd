"""One HTTP/1.1 connection: read requests, run the handler, write responses.

Theory of operation
-------------------
h11 owns the protocol state; this module owns time and I/O. A connection runs
request cycles until one of them says to stop:

1. IDLE - wait for the first byte of the next request (bytes a pipelining
   client already sent count). A fresh connection may idle until its header
   deadline, a kept-alive one for ``keepalive_timeout``. Timeout, EOF and
   shutdown (which cancels the idle scope) end the connection quietly;
   shutdown spares a connection whose next request's bytes already arrived.
2. HEAD - read until h11 yields the request head, before ``header_timeout``
   counted from accept (first request) or from the first byte, each
   connection's read deadlines stretched by its own 0-5 %; events
   already buffered are taken without a wait (no cancel scope). Malformed
   input -> 400 (or h11's hint; also a request with both Content-Length and
   Transfer-Encoding, RFC 9112 6.1), too big -> 431, late -> 408, other HTTP
   versions -> 505; each of these closes the connection.
3. BODY - a Content-Length above ``max_body_bytes`` -> 413 at once. Otherwise
   send ``100 Continue`` if the client waits for it, then read the body within
   ``body_timeout`` (408), counting chunked bodies as they come (413).
4. RESPOND - the request is routed once (:meth:`HttpConnection._route`; before
   the body when the client waits on ``Expect: 100-continue``, so that a
   refusal spares the body): a CORS preflight is answered by the CORS policy,
   before the handler (and so before any API-key check); otherwise the
   handler's ``route`` gives a refusal, an answer from memory (/health, the
   chat page) or the handler to run. Every response of the exchange, errors
   included, carries the policy's headers for the request's ``Origin`` once
   its head is parsed. A refusal or an answer from memory is sent at once.
   Otherwise run the handler and send its answer while a watcher task keeps
   reading: EOF or a reset cancels the handler / stream; other bytes (the next
   pipelined request) are fed to h11 for later, up to a byte budget. A small
   response goes out in one send.
5. Loop if both sides kept the connection alive, nothing broke and shutdown
   has not begun. The connection ends with a graceful close (half-close, then
   drain) after a complete exchange, or an abortive one (reset) otherwise.
"""

from __future__ import annotations

import logging
import random

import h11
import trio

from kestrel_trio.http.metrics import HttpMetrics
from kestrel_trio.http.policy.cors import CorsPolicy
from kestrel_trio.http.policy.hosts import HostAllowlist
from kestrel_trio.http.policy.limits import HttpLimits
from kestrel_trio.http.protocol.exchange import CLIENT_CLOSED, Exchange
from kestrel_trio.http.protocol.transport import Transport
from kestrel_trio.http.protocol.wire import SUPPORTED_VERSIONS, declared_length, head_size, to_request
from kestrel_trio.http.protocol.writer import ResponseWriter
from kestrel_trio.http.responses import error_response, internal_error_response, response_for_exception
from kestrel_trio.http.types import Handler, Immediate, Request, Response, Route, StreamingResponse

__all__ = ["HttpConnection"]

_log = logging.getLogger("kestrel_trio.http")
# Errors that end one connection and nothing more.
_CONNECTION_ERRORS = (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_TIMED_OUT = object()  # _read_body's answer when the body deadline passed
_DEADLINE_SPREAD = 0.05  # fraction by which a connection's read deadlines may be stretched (see __init__)
_PROTOCOL_ERROR_MESSAGES = {
    400: "Malformed HTTP request: a request line, header or body framing that HTTP/1.1 does not allow.",
    431: "The request head is too large.",
    501: "The request uses a transfer coding this server does not implement.",
}


def _has_both_framings(event: h11.Request) -> bool:
    names = {name for name, _ in event.headers}  # h11 lower-cases header names
    return b"content-length" in names and b"transfer-encoding" in names


class HttpConnection:
    """Serve the requests of one accepted connection, in order.

    Args:
        transport: the connection's socket.
        handler: answers each request.
        limits: the deadlines and size limits.
        shutting_down: set when the server begins its shutdown.
        access_log: receives one INFO line per request.
        client: the peer as ``"host:port"``.
        metrics: counts the requests this layer refuses itself (by error code).
        cors: which other origins' pages may call; None: no CORS handling at all.
        hosts: the ``Host`` values answered (others get 403); None: any.
    """

    def __init__(
        self,
        transport: Transport,
        handler: Handler,
        limits: HttpLimits,
        shutting_down: trio.Event,
        access_log: logging.Logger,
        client: str,
        metrics: HttpMetrics | None = None,
        cors: CorsPolicy | None = None,
        hosts: HostAllowlist | None = None,
    ) -> None:
        self._transport = transport
        self._hosts = hosts
        self._cors = cors
        self._metrics = metrics
        self._handler = handler
        self._limits = limits
        self._shutting_down = shutting_down
        self._access_log = access_log
        self.client = client
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self._writer = ResponseWriter(self._h11, transport, shutting_down)
        self._accepted_at = trio.current_time()
        self._head_started = self._accepted_at
        self._served = 0
        self._idle_scope: trio.CancelScope | None = None
        self._peer_gone = False  # EOF or reset seen while responding
        self._broken = False  # the last response was cut short
        self._ended_idle = False  # closed between requests: nothing left to deliver
        self._read_ahead_budget = 0
        # Each connection's read deadlines are stretched by its own 0-5 %: connections opened in one burst
        # (a slowloris attack) then expire spread over a moment instead of all in one event-loop turn,
        # which would delay every other request. No client is ever cut before its configured deadline.
        stretch = 1.0 + _DEADLINE_SPREAD * random.random()
        self._header_timeout = limits.header_timeout * stretch
        self._body_timeout = limits.body_timeout * stretch

    def close_if_idle(self) -> None:
        """End the connection now if it is waiting for a next request and none has arrived.

        A request whose bytes are already in the socket was sent before the
        server closed: it is served (its response says ``Connection: close``)
        rather than dropped unanswered, which the client could not tell from a
        crash.
        """
        if self._idle_scope is not None and not self._transport.has_bytes_waiting():
            self._idle_scope.cancel()

    async def serve(self) -> None:
        """Run request cycles until the connection ends; never raises connection errors."""
        try:
            while await self._serve_one():
                self._h11.start_next_cycle()
        except _CONNECTION_ERRORS as exc:
            self._broken = True
            _log.debug("connection from %s ended: %r", self.client, exc)
        finally:
            if self._broken or self._peer_gone:
                await self._transport.abort()
            elif self._ended_idle:
                await self._transport.close()
            else:
                await self._transport.close_gracefully()

    async def _serve_one(self) -> bool:
        """Serve one request; True if the connection may carry another."""
        if not await self._await_request_start():
            return False
        exchange = Exchange(self.client)
        self._writer.extra_headers = ()  # until this request's head says where it comes from
        try:
            received = await self._read_request(exchange)
            if received is None:
                return False
            await self._respond(*received, exchange)
        finally:
            exchange.log(self._access_log)
        self._served += 1
        return self._keeps_alive()

    def _keeps_alive(self) -> bool:
        if self._broken or self._peer_gone or self._shutting_down.is_set():
            return False
        return self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE

    # -- IDLE ---------------------------------------------------------------

    async def _await_request_start(self) -> bool:
        """Wait for the first byte of the next request; False to close quietly."""
        if self._h11.trailing_data[0]:
            self._mark_head_start()
            return True
        if self._served == 0:
            deadline = self._accepted_at + self._header_timeout
        else:
            deadline = trio.current_time() + self._limits.keepalive_timeout
        with trio.CancelScope(deadline=deadline) as idle:
            self._idle_scope = idle
            if self._shutting_down.is_set() and not self._transport.has_bytes_waiting():
                idle.cancel()
            data = await self._transport.receive()
        self._idle_scope = None
        if idle.cancelled_caught or not data:
            self._ended_idle = True
            return False
        self._h11.receive_data(data)
        self._mark_head_start()
        return True

    def _mark_head_start(self) -> None:
        # The first request's head deadline counts from accept.
        if self._served > 0:
            self._head_started = trio.current_time()

    # -- HEAD and BODY ------------------------------------------------------

    async def _read_request(self, exchange: Exchange) -> tuple[Request, Route | None] | None:
        """Receive one request, and its route if it was decided from the head; None if the connection must
        close (any error answered)."""
        try:
            event = await self._event_before(self._head_started + self._header_timeout)
            if event is None:
                await self._send_error(exchange, 408, "Timed out while receiving the request head.", "header_timeout")
                return None
            if not isinstance(event, h11.Request):
                return None  # ConnectionClosed: the client left between requests
            exchange.method = event.method.decode("latin-1")
            exchange.path = event.target.decode("latin-1").partition("?")[0]
            self._writer.extra_headers = self._cors_headers(event)
            accepted, route = await self._accept_head(event, exchange)
            if not accepted:
                return None
            body = await self._read_body(trio.current_time() + self._body_timeout)
            if body is _TIMED_OUT:
                await self._send_error(exchange, 408, "Timed out while receiving the request body.", "body_timeout")
                return None
            if body is None:
                await self._send_body_too_large(exchange)
                return None
            return to_request(event, body, self.client), route
        except h11.RemoteProtocolError as exc:
            if self._h11.trailing_data[1]:
                return None  # the client sent EOF: nobody left to answer
            # A fixed message: h11's own text quotes the offending bytes, which may be a credential.
            message = _PROTOCOL_ERROR_MESSAGES.get(exc.error_status_hint, "Malformed HTTP request.")
            await self._send_error(exchange, exc.error_status_hint, message, "malformed_request")
            return None

    async def _accept_head(self, event: h11.Request, exchange: Exchange) -> tuple[bool, Route | None]:
        """Check the head against the limits, answering any violation; whether it was accepted, and its route
        when the client waits on ``Expect: 100-continue`` (decided now, from the head)."""
        if event.http_version not in SUPPORTED_VERSIONS:
            message = "Only HTTP/1.0 and HTTP/1.1 are supported."
            await self._send_error(exchange, 505, message, "http_version_not_supported")
            return False, None
        if head_size(event) > self._limits.max_header_bytes:
            await self._send_error(exchange, 431, "The request head is too large.", "header_too_large")
            return False, None
        if self._hosts is not None:
            host = dict(event.headers).get(b"host", b"").decode("latin-1")
            if not self._hosts.allows(host):
                message = (f"Host {host[:100]!r} is not allowed: this server answers only "
                           f"{', '.join(sorted(self._hosts.names))} (see --host-allowlist).")
                await self._send_error(exchange, 403, message, "host_not_allowed")
                return False, None
        if _has_both_framings(event):
            # RFC 9112 6.1: such a request may be a smuggling attempt (a proxy in front may frame it the other
            # way); refused, and the connection closed, before any of its body is read.
            message = "A request may not carry both Content-Length and Transfer-Encoding."
            await self._send_error(exchange, 400, message, "malformed_request")
            return False, None
        length = declared_length(event)
        if length is not None and length > self._limits.max_body_bytes:
            await self._send_body_too_large(exchange)
            return False, None
        route = None
        if self._h11.they_are_waiting_for_100_continue:
            # Whatever can be refused from the head alone (a missing API key, an unknown path) is refused
            # now, before the client sends a body nobody will read.
            head = to_request(event, b"", self.client)
            route = self._route(head)
            if isinstance(route, Immediate):
                route = self._answer_from_memory(route, head)  # answered from memory: it reads no body
            if isinstance(route, Response) and route.status >= 400:
                await self._writer.send_response(route, exchange.method, exchange, close=True)
                return False, None
            await self._writer.send_event(h11.InformationalResponse(status_code=100, headers=[]))
        return True, route

    async def _read_body(self, deadline: float) -> bytes | None | object:
        """The whole request body; None once it exceeds max_body_bytes, _TIMED_OUT past ``deadline``."""
        body = bytearray()
        while True:
            event = await self._event_before(deadline)
            if event is None:
                return _TIMED_OUT
            if isinstance(event, h11.EndOfMessage):
                return bytes(body)
            if not isinstance(event, h11.Data):
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} in a request body")
            body += event.data
            if len(body) > self._limits.max_body_bytes:
                return None

    async def _event_before(self, deadline: float) -> h11.Event | type[h11.PAUSED] | None:
        """The next h11 event, or None if ``deadline`` (trio time, s) passes first."""
        event = self._h11.next_event()
        if event is not h11.NEED_DATA:
            return event  # already buffered: no wait, so no cancel scope to pay for
        with trio.move_on_at(deadline):
            return await self._next_event()
        return None

    async def _next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._h11.receive_data(await self._transport.receive())

    # -- RESPOND ------------------------------------------------------------

    async def _respond(self, request: Request, route: Route | None, exchange: Exchange) -> None:
        """Send the response of ``route`` (routed now if the head did not decide it), cancelling a handler
        and its stream if the client leaves."""
        if route is None:
            route = self._route(request)
        if isinstance(route, Immediate):
            route = self._answer_from_memory(route, request)
        if isinstance(route, Response):
            # A refusal, or answered from memory: nothing runs long, so no watcher task is needed.
            await self._writer.send_response(route, request.method, exchange)
            return
        pending = len(self._h11.trailing_data[0])
        self._read_ahead_budget = self._limits.max_header_bytes + self._limits.max_body_bytes - pending
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_peer, nursery.cancel_scope)
            try:
                await self._answer(route, request, exchange)
            except _CONNECTION_ERRORS as exc:
                self._broken = True
                _log.debug("response to %s failed: %r", self.client, exc)
            finally:
                nursery.cancel_scope.cancel()  # stop the watcher
        if self._peer_gone and not exchange.completed:
            exchange.status = CLIENT_CLOSED

    async def _watch_peer(self, respond_scope: trio.CancelScope) -> None:
        """Keep reading while a response is produced; cancel it when the peer leaves."""
        while self._read_ahead_budget > 0:
            data = await self._transport.receive()
            if not data:
                self._peer_gone = self._writer.quiet = True
                respond_scope.cancel()
                return
            self._h11.receive_data(data)  # a pipelined request, served later
            self._read_ahead_budget -= len(data)

    def _cors_headers(self, event: h11.Request) -> tuple[tuple[str, str], ...]:
        if self._cors is None:
            return ()
        origin = next((value.decode("latin-1") for name, value in event.headers if name == b"origin"), None)
        return self._cors.response_headers(origin)

    def _route(self, request: Request) -> Route:
        """What answers ``request``, decided once: a CORS preflight, or the handler's ``route`` (a refusal,
        an answer from memory, or the handler to run); a plain handler function is its own route."""
        if self._cors is not None:
            preflight = self._cors.preflight(request)
            if preflight is not None:
                return preflight
        route = getattr(self._handler, "route", None)
        if route is None:
            return self._handler
        try:
            return route(request)
        except Exception as exc:
            return response_for_exception(exc)

    @staticmethod
    def _answer_from_memory(immediate: Immediate, request: Request) -> Response:
        try:
            return immediate.answer(request)
        except Exception as exc:
            return response_for_exception(exc)

    async def _answer(self, handler: Handler, request: Request, exchange: Exchange) -> None:
        try:
            result = await handler(request)
        except Exception as exc:
            if self._peer_gone:
                return
            result = response_for_exception(exc)
        if isinstance(result, StreamingResponse):
            if not await self._writer.send_streaming(result, request.method, exchange):
                self._broken = True
        elif isinstance(result, Response):
            await self._writer.send_response(result, request.method, exchange)
        else:
            _log.error("request handler returned %r, not a Response", type(result))
            await self._writer.send_response(internal_error_response(), request.method, exchange)

    async def _send_body_too_large(self, exchange: Exchange) -> None:
        message = f"The request body exceeds {self._limits.max_body_bytes} bytes."
        await self._send_error(exchange, 413, message, "body_too_large")

    async def _send_error(self, exchange: Exchange, status: int, message: str, code: str) -> None:
        """Answer with an error envelope and Connection: close, if h11 still allows a response."""
        if self._metrics is not None:
            self._metrics.refused.inc(code=code)
        if self._h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            self._broken = True
            return
        response = error_response(status, message, code=code)
        await self._writer.send_response(response, exchange.method, exchange, close=True)
