"""Clients that go away while their request is being answered."""

from __future__ import annotations

import logging
import socket
import struct

import pytest
import trio
import trio.testing

from http_kit import RawClient, build_request, start_server

pytestmark = pytest.mark.usefixtures("close_raw_clients")
BUDGET = 10  # s per test (virtual with autojump_clock: the deadlines are trio.sleep's, not the machine's speed)
PROMPTLY = 1.0  # virtual s; the slow stream yields every 0.05 s and would run forever


async def read_first_event(client: RawClient) -> bytes:
    received = b""
    while b"data: 0\n\n" not in received:
        received += await client.read_some()
    return received


async def wait_for_no_connections(running) -> None:
    while running.server.connections:
        await trio.sleep(0.01)


async def test_disconnect_mid_stream_closes_the_generator_promptly(nursery, autojump_clock):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(build_request("GET", "/stream"))
        await read_first_event(client)
        await client.aclose()
        with trio.fail_after(PROMPTLY):
            await running.app.stream.closed.wait()
            await wait_for_no_connections(running)


async def test_reset_mid_stream_closes_the_generator_promptly(nursery, autojump_clock):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(build_request("GET", "/stream"))
        await read_first_event(client)
        client.stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await client.aclose()  # sends RST
        with trio.fail_after(PROMPTLY):
            await running.app.stream.closed.wait()
            await wait_for_no_connections(running)


async def test_disconnect_while_the_handler_runs_cancels_it(nursery, caplog, autojump_clock):
    caplog.set_level(logging.INFO)
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(build_request("GET", "/slow"))
        await trio.testing.wait_all_tasks_blocked()
        assert not running.app.handler_cancelled.is_set()
        await client.aclose()
        with trio.fail_after(PROMPTLY):
            await running.app.handler_cancelled.wait()
            await wait_for_no_connections(running)
        await trio.testing.wait_all_tasks_blocked()
    statuses = [getattr(record, "http_status", None) for record in caplog.records]
    assert 499 in statuses  # logged as abandoned by the client
    assert not any(record.levelname == "ERROR" for record in caplog.records)


async def test_server_survives_abandoned_requests(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        for path in ("/stream", "/slow", "/finite"):
            client = await RawClient.connect(running.port)
            await client.send(build_request("GET", path))
            await client.aclose()
        client = await RawClient.connect(running.port)
        assert (await client.request("GET", "/hello")).status == 200
