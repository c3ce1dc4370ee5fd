"""Connection limit, graceful shutdown and the access log."""

from __future__ import annotations

import logging
import os
import time

import attrs
import pytest
import trio
import trio.testing

from http_kit import HOST, RawClient, assert_envelope, build_request, start_server
from kestrel_trio.http import HttpLimits

pytestmark = pytest.mark.usefixtures("close_raw_clients")
BUDGET = 10  # s, absolute per test (virtual with autojump_clock)


async def test_one_client_cannot_hold_every_connection_slot(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, HttpLimits(max_connections=8, max_connections_per_client=2))
        held = [await RawClient.connect(running.port) for _ in range(2)]
        for client in held:
            assert (await client.request("GET", "/hello")).status == 200
        extra = await RawClient.connect(running.port)
        await extra.send(build_request("GET", "/hello"))
        assert_envelope(await extra.read_response(), 503, "too_many_connections")
        assert running.server.connections == 2
        await held[0].aclose()
        while running.server.connections > 1:
            await trio.sleep(0.01)
        assert (await (await RawClient.connect(running.port)).request("GET", "/hello")).status == 200


async def test_the_default_per_client_cap_spares_loopback_and_bounds_other_hosts():
    from kestrel_trio.http.policy.limits import per_client_cap

    limits = HttpLimits(max_connections=100)
    assert per_client_cap(limits, "127.0.0.1") == per_client_cap(limits, "::1") == 100
    assert per_client_cap(limits, "::ffff:127.0.0.1") == 100
    assert per_client_cap(limits, "192.0.2.7") == per_client_cap(limits, "2001:db8::1") == 25
    assert per_client_cap(attrs.evolve(limits, max_connections_per_client=3), "127.0.0.1") == 3


async def test_connections_beyond_the_limit_get_503_and_close(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, HttpLimits(max_connections=2))
        first, second = await RawClient.connect(running.port), await RawClient.connect(running.port)
        for client in (first, second):
            assert (await client.request("GET", "/hello")).status == 200
        assert running.server.connections == 2

        extra = await RawClient.connect(running.port)
        await extra.send(build_request("GET", "/hello"))
        got = await extra.read_response()
        assert_envelope(got, 503, "too_many_connections")
        assert got.headers["retry-after"] == "1"
        assert got.headers["connection"] == "close"
        assert await extra.read_until_closed() == b""
        assert running.server.connections == 2

        await first.aclose()
        while running.server.connections > 1:
            await trio.sleep(0.01)
        again = await RawClient.connect(running.port)
        assert (await again.request("GET", "/hello")).status == 200


async def test_shutdown_refuses_new_connections_and_lets_a_stream_finish(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, HttpLimits(shutdown_grace=5.0))
        client = await RawClient.connect(running.port)
        await client.send(build_request("GET", "/finite"))
        await running.app.stream.started.wait()

        running.server.begin_shutdown()
        assert running.server.shutting_down.is_set()
        with pytest.raises(OSError):
            await trio.open_tcp_stream(HOST, running.port)

        got = await client.read_response()
        assert got.body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert await client.read_until_closed() == b""  # no keep-alive while shutting down
        await client.aclose()
        await running.stopped.wait()


async def test_shutdown_cancels_an_endless_stream_after_the_grace(nursery, autojump_clock):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, HttpLimits(shutdown_grace=2.0))
        client = await RawClient.connect(running.port)
        await client.send(build_request("GET", "/stream"))
        await running.app.stream.started.wait()
        began = trio.current_time()
        running.server.begin_shutdown()
        await running.stopped.wait()
        assert running.app.stream.closed.is_set()
        assert 2.0 <= running.app.stream.closed_at - began < 2.1
        assert running.server.connections == 0


async def test_shutdown_closes_idle_keep_alive_connections_at_once(nursery, autojump_clock):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, HttpLimits(keepalive_timeout=5.0, shutdown_grace=3.0))
        idle = await RawClient.connect(running.port)
        assert (await idle.request("GET", "/hello")).status == 200
        fresh = await RawClient.connect(running.port)  # accepted, nothing sent yet
        await trio.testing.wait_all_tasks_blocked()
        began = trio.current_time()
        running.server.begin_shutdown()
        assert await idle.read_until_closed() == b""
        assert await fresh.read_until_closed() == b""
        await running.stopped.wait()
        assert trio.current_time() - began < 0.1


async def test_shutdown_serves_requests_whose_bytes_had_already_arrived(nursery):
    """A request sent before the shutdown, still unread in the socket, is answered, not dropped unanswered."""
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, HttpLimits(keepalive_timeout=5.0, shutdown_grace=3.0))
        kept = await RawClient.connect(running.port)
        assert (await kept.request("GET", "/hello")).status == 200
        fresh = await RawClient.connect(running.port)
        await trio.testing.wait_all_tasks_blocked()  # both connections wait for a next request
        for client in (kept, fresh):  # written without a checkpoint: the server cannot read them yet
            os.write(client.stream.socket.fileno(), build_request("GET", "/hello"))
        waiting_until = time.monotonic() + 2.0  # loopback delivers at once; a blocking wait keeps trio still
        while not all(c._transport.has_bytes_waiting() for c in running.server._live):
            assert time.monotonic() < waiting_until, "the requests never reached the server's sockets"
            time.sleep(0.001)
        running.server.begin_shutdown()
        for client in (kept, fresh):
            got = await client.read_response()
            assert got.status == 200 and got.headers["connection"] == "close"
            assert await client.read_until_closed() == b""
        await running.stopped.wait()


async def test_response_finished_during_shutdown_says_connection_close(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(build_request("GET", "/gate"))
        await trio.testing.wait_all_tasks_blocked()
        running.server.begin_shutdown()
        running.app.gate.set()
        got = await client.read_response()
        assert got.status == 200
        assert got.headers["connection"] == "close"
        assert await client.read_until_closed() == b""
        await client.aclose()
        await running.stopped.wait()


async def test_one_access_log_line_per_request(nursery, caplog):
    caplog.set_level(logging.INFO, logger="kestrel_trio.access")
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.request("GET", "/hello?q=1")
        await client.request("POST", "/echo", b"abc")
        await client.request("GET", "/missing")
        await trio.testing.wait_all_tasks_blocked()  # the line follows the response
    lines = [record for record in caplog.records if record.name == "kestrel_trio.access"]
    assert [(r.http_method, r.http_path, r.http_status) for r in lines] == [
        ("GET", "/hello", 200),
        ("POST", "/echo", 200),
        ("GET", "/missing", 404),
    ]
    assert all(r.levelno == logging.INFO and r.http_client.startswith("127.0.0.1:") for r in lines)
    assert lines[1].http_bytes_out > 0 and lines[1].http_duration_ms >= 0
    assert '"POST /echo" 200' in lines[1].getMessage()
