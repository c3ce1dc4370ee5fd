"""The listening side: accept loop, connection limit and graceful shutdown.

Theory of operation
-------------------
``serve_http`` binds, reports an :class:`HttpServer` through ``task_status``
and runs one accept loop per listening socket, all inside a cancel scope.
Every accepted connection gets its own task in the connections nursery; one
above ``max_connections`` instead gets a short-lived task that answers 503 and
closes it.

``begin_shutdown()`` sets ``shutting_down``, cancels the accept scope and closes
the listening sockets (new connects are refused from then on), and closes
connections idling between requests. ``serve_http`` then waits up to
``shutdown_grace`` seconds for the remaining connections to finish their
current exchange (each closes afterwards, answering with ``Connection: close``),
cancels whatever is left and returns.
"""

from __future__ import annotations

import logging

import h11
import trio

from kestrel_trio.http.metrics import HttpMetrics
from kestrel_trio.http.policy.cors import CorsPolicy
from kestrel_trio.http.policy.hosts import HostAllowlist
from kestrel_trio.http.policy.limits import HttpLimits, per_client_cap
from kestrel_trio.http.protocol.connection import HttpConnection
from kestrel_trio.http.protocol.transport import Transport, peer_name
from kestrel_trio.http.protocol.wire import response_head
from kestrel_trio.http.responses import error_response, retry_after_header
from kestrel_trio.http.types import Handler

__all__ = ["HttpServer", "serve_http"]

_log = logging.getLogger("kestrel_trio.http")
_ACCEPT_BACKOFF = 0.1  # s, pause after accept fails (e.g. out of file descriptors)
_BUSY_RETRY_AFTER = 1.0  # s, suggested to clients turned away at max_connections
# A turned-away client gets its 503 with a short linger, so a reject holds its slot briefly; past this many
# rejects in flight (times max_connections, at least _MIN_REJECTS) a flood is dropped without an answer.
_REJECT_LINGER = 0.2  # s
_REJECTS_PER_CONNECTION = 4
_MIN_REJECTS = 64


class HttpServer:
    """A running server, as reported by :func:`serve_http` through ``task_status``.

    Attributes:
        host: the host it was bound to.
        port: the real bound port (useful after binding port 0).
        shutting_down: set once :meth:`begin_shutdown` was called; handlers
            producing long streams may wait on it to end them early with a
            final chunk of their own.
    """

    def __init__(
        self,
        listeners: list[trio.SocketListener],
        host: str,
        handler: Handler,
        limits: HttpLimits,
        access_log: logging.Logger,
        cors: CorsPolicy | None = None,
        hosts: HostAllowlist | None = None,
    ) -> None:
        self.host = host
        self._cors = cors
        self._hosts = hosts
        self.port: int = listeners[0].socket.getsockname()[1]
        self.shutting_down = trio.Event()
        self._listeners = listeners
        self._handler = handler
        self._limits = limits
        self._access_log = access_log
        self._live: set[HttpConnection] = set()
        self._per_peer: dict[str, int] = {}  # open connections by peer address, against per_client_cap
        self.metrics = HttpMetrics(open_connections=lambda: len(self._live))
        self._rejecting = 0
        self._accept_scope = trio.CancelScope()
        self._connection_closed = trio.Event()

    @property
    def connections(self) -> int:
        """The number of connections being served now (rejected ones excluded)."""
        return len(self._live)

    def begin_shutdown(self) -> None:
        """Stop accepting, close idle connections, and let in-flight exchanges finish.

        After ``limits.shutdown_grace`` seconds what remains is cancelled and
        :func:`serve_http` returns. Calling it again does nothing.
        """
        if self.shutting_down.is_set():
            return
        self.shutting_down.set()
        self._accept_scope.cancel()
        for listener in self._listeners:
            listener.socket.close()
        for connection in list(self._live):
            connection.close_if_idle()

    async def _accept_all(self, nursery: trio.Nursery) -> None:
        with self._accept_scope:
            async with trio.open_nursery() as accepting:
                for listener in self._listeners:
                    accepting.start_soon(self._accept_loop, listener, nursery)

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except trio.ClosedResourceError:
                return
            except OSError as exc:
                _log.warning("accept failed: %r", exc)
                await trio.sleep(_ACCEPT_BACKOFF)
                continue
            self._dispatch(stream, nursery)

    def _dispatch(self, stream: trio.SocketStream, nursery: trio.Nursery) -> None:
        self.metrics.accepted.inc()
        peer = _peer_host(stream)
        held = self._per_peer.get(peer, 0)
        if len(self._live) >= self._limits.max_connections or held >= per_client_cap(self._limits, peer):
            nursery.start_soon(self._reject, self._transport(stream, _REJECT_LINGER), peer_name(stream))
            return
        transport = self._transport(stream)
        connection = HttpConnection(
            transport, self._handler, self._limits, self.shutting_down, self._access_log, peer_name(stream),
            self.metrics, self._cors, self._hosts,
        )
        self._live.add(connection)  # counted from accept on
        self._per_peer[peer] = held + 1
        nursery.start_soon(self._run_connection, connection, peer)

    def _transport(self, stream: trio.SocketStream, linger_timeout: float | None = None) -> Transport:
        return Transport(
            stream,
            write_timeout=self._limits.write_timeout,
            linger_timeout=self._limits.linger_timeout if linger_timeout is None else linger_timeout,
            drain_limit=self._limits.max_header_bytes + self._limits.max_body_bytes,
        )

    async def _run_connection(self, connection: HttpConnection, peer: str) -> None:
        try:
            await connection.serve()
        except Exception:
            _log.exception("connection from %s failed", connection.client)
        finally:
            self._live.discard(connection)
            self._per_peer[peer] -= 1
            if not self._per_peer[peer]:
                del self._per_peer[peer]
            self._connection_closed.set()
            self._connection_closed = trio.Event()

    async def _reject(self, transport: Transport, client: str) -> None:
        """Answer 503 without reading the request, then close."""
        if self._rejecting >= max(_MIN_REJECTS, _REJECTS_PER_CONNECTION * self._limits.max_connections):
            self.metrics.turned_away.inc(answer="dropped")
            await transport.abort()  # a flood: do not even answer
            return
        self.metrics.turned_away.inc(answer="503")
        self._rejecting += 1
        try:
            await transport.send(_busy_response_bytes())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await transport.abort()
        else:
            self._access_log.info('%s "- -" 503 0 0.0ms', client)
            await transport.close_gracefully()
        finally:
            self._rejecting -= 1

    async def _drain(self, connections: trio.CancelScope) -> None:
        """Wait up to the grace period for connections to finish, then cancel them."""
        with trio.move_on_after(self._limits.shutdown_grace):
            while self._live:
                await self._connection_closed.wait()
        connections.cancel()

    async def _close_listeners(self) -> None:
        for listener in self._listeners:
            await trio.aclose_forcefully(listener)


def _peer_host(stream: trio.SocketStream) -> str:
    """The peer's IP address ("" if the socket no longer knows it)."""
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return ""


def _busy_response_bytes() -> bytes:
    response = error_response(
        503, "The server is handling too many connections; retry later.", code="too_many_connections"
    )
    framing = (("content-length", str(len(response.body))), ("connection", "close"))
    framing += retry_after_header(_BUSY_RETRY_AFTER)
    writer = h11.Connection(h11.SERVER)
    head = response_head(response.status, response.headers, response.content_type, framing)
    return writer.send(head) + writer.send(h11.Data(data=response.body)) + writer.send(h11.EndOfMessage())


async def serve_http(
    handler: Handler,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: HttpLimits = HttpLimits(),
    access_log: logging.Logger | None = None,
    cors: CorsPolicy | None = None,
    hosts: HostAllowlist | None = None,
    task_status: trio.TaskStatus[HttpServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve HTTP/1.1 on ``host:port`` until cancelled or shut down.

    Args:
        handler: answers every request (see :data:`Handler`).
        host: the address to bind. A name resolving to several addresses gets
            one listener each; with port 0 these may differ and
            ``HttpServer.port`` reports the first.
        port: the TCP port; 0 picks a free one (see ``HttpServer.port``).
        limits: the deadlines and size limits.
        access_log: gets one INFO line per request; default logger
            ``kestrel_trio.access``.
        cors: which other origins' web pages may call the server (preflights,
            ``Access-Control-Allow-Origin``); None: no CORS handling, so an
            ``OPTIONS`` preflight reaches ``handler`` like any request.
        hosts: the ``Host`` header values answered; others get 403 (DNS rebinding). None: any host.
        task_status: receives the :class:`HttpServer` once bound.

    Returns after :meth:`HttpServer.begin_shutdown` once every connection is
    done or ``limits.shutdown_grace`` seconds passed.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    log = access_log if access_log is not None else logging.getLogger("kestrel_trio.access")
    server = HttpServer(listeners, host, handler, limits, log, cors, hosts)
    try:
        async with trio.open_nursery() as connections:
            task_status.started(server)
            await server._accept_all(connections)
            await server._drain(connections.cancel_scope)
    finally:
        await server._close_listeners()
