"""A socket stream with the server's write-stall rule and two ways to close."""

from __future__ import annotations

import select
import socket
import struct

import trio

__all__ = ["Transport", "peer_name", "RECEIVE_SIZE"]

RECEIVE_SIZE = 64 * 1024


def peer_name(stream: trio.SocketStream) -> str:
    """The peer of ``stream`` as ``"host:port"`` (``"[v6]:port"``), or ``"unknown"``."""
    try:
        address = stream.socket.getpeername()
    except OSError:
        return "unknown"
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


class Transport:
    """One accepted TCP connection.

    Args:
        stream: the accepted socket stream.
        write_timeout: seconds a send slice may make no progress before the
            connection counts as broken.
        linger_timeout: seconds :meth:`close_gracefully` waits for the peer.
        drain_limit: bytes :meth:`close_gracefully` reads and discards at most.
    """

    def __init__(
        self, stream: trio.SocketStream, *, write_timeout: float, linger_timeout: float, drain_limit: int
    ) -> None:
        self._stream = stream
        self._write_timeout = write_timeout
        self._linger_timeout = linger_timeout
        self._drain_limit = drain_limit

    def has_bytes_waiting(self) -> bool:
        """Whether bytes (or the peer's close) are already here to be read, without waiting: poll(2), timeout 0."""
        poller = select.poll()
        poller.register(self._stream.socket.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    async def receive(self) -> bytes:
        """The next bytes from the peer; ``b""`` once it closed or reset the connection."""
        try:
            return await self._stream.receive_some(RECEIVE_SIZE)
        except trio.BrokenResourceError:
            return b""

    async def send(self, data: bytes) -> None:
        """Send all of ``data``.

        Raises:
            trio.BrokenResourceError: the peer is gone, or the socket accepted
                no byte for ``write_timeout`` seconds (abort the connection).
            trio.ClosedResourceError: the stream was closed.
        """
        view = memoryview(data)
        while view:
            # Each socket send moves whatever fits, so the deadline measures a
            # lack of progress rather than the time a large body takes.
            with trio.move_on_after(self._write_timeout) as stall:
                try:
                    sent = await self._stream.socket.send(view)
                except OSError as exc:
                    raise trio.BrokenResourceError(f"send failed: {exc!r}") from exc
            if stall.cancelled_caught:
                raise trio.BrokenResourceError(f"no write progress for {self._write_timeout} s")
            view = view[sent:]

    async def close_gracefully(self) -> None:
        """Half-close, drain what the peer still sends for a while, then close.

        Closing with unread input makes the kernel send a reset, which can
        destroy a response the peer has not read yet; draining avoids that.
        """
        try:
            with trio.move_on_after(self._linger_timeout):
                await self._stream.send_eof()
                drained = 0
                while drained <= self._drain_limit:
                    data = await self._stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        break
                    drained += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(self._stream)

    async def close(self) -> None:
        """Close at once, with a normal FIN; for connections with nothing in flight."""
        await trio.aclose_forcefully(self._stream)

    async def abort(self) -> None:
        """Close at once with a reset, dropping unsent data (no orphaned kernel buffers)."""
        try:
            self._stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except (OSError, trio.ClosedResourceError):
            pass
        await trio.aclose_forcefully(self._stream)
