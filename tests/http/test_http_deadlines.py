"""The named deadlines, on real sockets with trio's autojump clock (virtual time)."""

from __future__ import annotations

import socket

import pytest
import trio

from http_kit import RawClient, assert_envelope, build_request, start_server
from kestrel_trio.http import HttpLimits
from kestrel_trio.http.protocol.transport import Transport

pytestmark = pytest.mark.usefixtures("close_raw_clients")
BUDGET = 60  # virtual s, absolute per test
SHORT = HttpLimits(header_timeout=0.5, body_timeout=0.7, keepalive_timeout=2.0, write_timeout=0.5)


async def trickle(client: RawClient, data: bytes, pause: float) -> None:
    """Send ``data`` one byte every ``pause`` seconds until done or the server hangs up."""
    try:
        for index in range(len(data)):
            await client.send(data[index : index + 1])
            await trio.sleep(pause)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def test_trickled_head_gets_408_at_the_total_header_deadline(nursery, autojump_clock):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, SHORT)
        client = await RawClient.connect(running.port)
        started = trio.current_time()
        async with trio.open_nursery() as inner:
            inner.start_soon(trickle, client, build_request("GET", "/hello"), 0.1)
            got = await client.read_response()
            elapsed = trio.current_time() - started
            inner.cancel_scope.cancel()
        assert_envelope(got, 408, "header_timeout")
        assert got.headers["connection"] == "close"
        assert 0.5 <= elapsed < 0.65


async def test_header_deadline_of_a_kept_alive_request_counts_from_its_first_byte(nursery, autojump_clock):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, SHORT)
        client = await RawClient.connect(running.port)
        assert (await client.request("GET", "/hello")).status == 200
        await trio.sleep(1.5)  # idle, within keepalive_timeout
        started = trio.current_time()
        async with trio.open_nursery() as inner:
            inner.start_soon(trickle, client, build_request("GET", "/hello"), 0.2)
            got = await client.read_response()
            elapsed = trio.current_time() - started
            inner.cancel_scope.cancel()
        assert_envelope(got, 408)
        assert 0.5 <= elapsed < 0.65


async def test_slow_body_gets_408_at_the_body_deadline(nursery, autojump_clock):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, SHORT)
        client = await RawClient.connect(running.port)
        await client.send(build_request("POST", "/echo", b"", (("Content-Length", "100"),)))
        started = trio.current_time()
        async with trio.open_nursery() as inner:
            inner.start_soon(trickle, client, b"x" * 100, 0.1)
            got = await client.read_response(method="POST")
            elapsed = trio.current_time() - started
            inner.cancel_scope.cancel()
        assert_envelope(got, 408, "body_timeout")
        assert 0.7 <= elapsed < 0.85


async def test_idle_keep_alive_connection_is_closed_quietly(nursery, autojump_clock):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, SHORT)
        client = await RawClient.connect(running.port)
        # requests spaced below keepalive_timeout keep the connection open
        for _ in range(3):
            assert (await client.request("GET", "/hello")).status == 200
            await trio.sleep(1.5)
        assert (await client.request("GET", "/hello")).status == 200
        idle_since = trio.current_time()
        assert await client.read_until_closed() == b""  # no response, just closed
        assert 2.0 <= trio.current_time() - idle_since < 2.2
        while running.server.connections:
            await trio.sleep(0.01)


async def test_silent_new_connection_is_closed_at_the_header_deadline(nursery, autojump_clock):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, SHORT)
        client = await RawClient.connect(running.port)
        started = trio.current_time()
        assert await client.read_until_closed() == b""
        assert 0.5 <= trio.current_time() - started < 0.65


async def test_client_that_stops_reading_is_cut_off_by_write_timeout(nursery, autojump_clock):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, SHORT)
        client = await RawClient.connect_small_window(running.port)
        await client.send(build_request("GET", "/firehose"))
        probe = running.app.stream
        await probe.started.wait()
        started = trio.current_time()
        await probe.closed.wait()  # the generator's finally ran
        assert probe.closed_at - started >= SHORT.write_timeout
        assert probe.chunks_made >= 1  # it streamed until the buffers filled
        while running.server.connections:
            await trio.sleep(0.01)
        # what the client can still read is a truncated body, then a reset or EOF
        received = await client.read_until_closed()
        assert received.startswith(b"HTTP/1.1 200 ")
        assert not received.endswith(b"0\r\n\r\n")



async def test_write_timeout_measures_a_lack_of_progress_not_total_time(autojump_clock):
    # A unix socketpair has no TCP timers, so virtual time is safe here.
    server_side, client_side = trio.socket.socketpair()
    # unix sockets become writable again once the sender's buffer is mostly drained
    server_side.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    transport = Transport(trio.SocketStream(server_side), write_timeout=0.5, linger_timeout=0.1, drain_limit=0)
    peer = trio.SocketStream(client_side)
    payload = b"z" * (512 * 1024)
    received = bytearray()

    async def read_slowly(stop_after: int) -> None:
        while len(received) < stop_after:
            received.extend(await peer.receive_some(16384))
            await trio.sleep(0.2)  # 80 KB/s: any 64 KiB write takes longer than write_timeout

    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_slowly, len(payload))
            started = trio.current_time()
            await transport.send(payload)  # takes many write_timeouts, never stalls for one
            assert trio.current_time() - started > 5 * 0.5
        assert bytes(received[: len(payload)]) == payload

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_slowly, len(received) + 100_000)  # then stops reading
            with pytest.raises(trio.BrokenResourceError, match="no write progress"):
                await transport.send(payload)
            stalled_at = trio.current_time()
        assert trio.current_time() - stalled_at < 0.5
        await transport.abort()
        await peer.aclose()
