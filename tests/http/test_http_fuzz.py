"""Property test: whatever bytes a client sends, the server answers well-formed
HTTP or closes, within its deadlines, and keeps serving afterwards.

Each example runs its own trio.run on an autojump MockClock, so deadlines cost
no real time; the server (small limits) lives for the whole example.
"""

from __future__ import annotations

import h11
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fuzz_kit import mutated, parse_responses

from http_kit import RawClient, build_request, start_server
from kestrel_trio.http import HttpLimits

LIMITS = HttpLimits(
    header_timeout=1.0,
    body_timeout=1.0,
    keepalive_timeout=1.0,
    write_timeout=1.0,
    max_header_bytes=512,
    max_body_bytes=256,
    linger_timeout=0.5,
)
# Worst case: a few pipelined cycles, each bounded by header + body deadlines, then linger.
WORST_CASE = 20.0  # virtual s
VALID = build_request("POST", "/echo", b"hello") + build_request("GET", "/hello?x=1")


PIECES = [b"GET ", b"/ ", b"HTTP/1.1", b"\r\n", b"Host: x", b": ", b"0\r\n", b"a" * 600]


payloads = st.one_of(
    st.binary(max_size=700),
    mutated(VALID, max_edits=6, bytes_tried=(0, 9, 10, 13, 32, 58, 127, 255), max_duplicate=600),
    st.lists(st.sampled_from(PIECES), max_size=12).map(b"".join),
)


async def throw_bytes(payload: bytes, half_close: bool) -> None:
    async with trio.open_nursery() as nursery:
        running = await start_server(nursery, LIMITS)
        client = await RawClient.connect(running.port)
        started = trio.current_time()
        try:
            await client.send(payload)
            if half_close:
                await client.stream.send_eof()
        except trio.BrokenResourceError:
            pass  # the server already answered and hung up
        received = await client.read_until_closed()
        assert trio.current_time() - started < WORST_CASE
        statuses = parse_responses(received)
        assert all(200 <= status < 600 for status in statuses)
        event(f"statuses: {statuses[:3]}")
        await client.aclose()
        while running.server.connections:  # no connection leaks
            await trio.sleep(0.1)

        fresh = await RawClient.connect(running.port)
        got = await fresh.request("POST", "/echo", b"still here")
        assert got.json()["body"] == "still here"
        await fresh.aclose()
        nursery.cancel_scope.cancel()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=payloads, half_close=st.booleans())
def test_arbitrary_bytes_get_well_formed_http_or_a_close(payload, half_close):
    clock = trio.testing.MockClock(autojump_threshold=0)
    trio.run(_bounded, payload, half_close, clock=clock)


async def _bounded(payload: bytes, half_close: bool) -> None:
    with trio.fail_after(60):  # virtual s, absolute
        await throw_bytes(payload, half_close)


def test_parse_responses_rejects_truncated_output():
    complete = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}"
    assert parse_responses(complete + complete) == [400, 400]
    with pytest.raises(h11.RemoteProtocolError):
        parse_responses(complete[:-1])
