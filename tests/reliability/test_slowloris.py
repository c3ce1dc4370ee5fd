"""Slowloris: many connections trickle a request head or body; each is cut at its
deadline while normal clients and /health keep being served.

Real sockets and real (small) deadlines: the deadline is the thing under test. The machine may be loaded, so
no bound here is absolute: /health under attack is compared with /health on the same server without tricklers,
measured in the same run, and the deadline's precision is left to the MockClock tests (tests/http).
"""

from __future__ import annotations

import json

import trio
from rel_kit import (
    HOST,
    LatencyProbe,
    completion_json,
    fetch,
    running_server,
    wait_until,
)

from kestrel_trio.engine import EngineLimits
from kestrel_trio.http import HttpLimits
from kestrel_trio.model import Model

ATTACKERS = 100  # half trickle heads, half trickle bodies
DEADLINE = 1.0  # s, both header_timeout and body_timeout
TRICKLE_INTERVAL = 0.1  # s between two bytes of a trickler
PROBE_INTERVAL = 0.02  # s between two /health probes
QUIET_PROBES = 25  # probes without tricklers before the attack, and as many after it
# /health p90 under attack over its p90 without tricklers: 5-15 on a loaded 2-core machine (the tricklers' own
# sends run in this process too); a /health that waits for a trickler's slot or deadline is 100 or more.
LATENCY_RATIO = 30
LIMITS = HttpLimits(header_timeout=DEADLINE, body_timeout=DEADLINE, keepalive_timeout=1.0, linger_timeout=0.2,
                    max_connections=ATTACKERS + 28)

HEAD_FOREVER = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 4000
BODY_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"


class Trickler:
    """One slowloris connection: sends ``prefix`` at once, then ``payload`` one byte at a time.

    Attributes:
        lifetime: seconds from connect until the server cut the connection.
        received: every byte the server sent before closing.
    """

    def __init__(self, port: int, prefix: bytes, payload: bytes) -> None:
        self.port = port
        self.prefix = prefix
        self.payload = payload
        self.lifetime: float | None = None
        self.received = b""

    async def run(self) -> None:
        stream = await trio.open_tcp_stream(HOST, self.port)
        started = trio.current_time()
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(self._trickle, stream)
            await self._read_until_closed(stream)
            self.lifetime = trio.current_time() - started
            nursery.cancel_scope.cancel()

    async def _trickle(self, stream: trio.SocketStream) -> None:
        try:
            if self.prefix:
                await stream.send_all(self.prefix)
            for index in range(len(self.payload)):
                await stream.send_all(self.payload[index:index + 1])
                await trio.sleep(TRICKLE_INTERVAL)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # cut by the server: the reader notices too

    async def _read_until_closed(self, stream: trio.SocketStream) -> None:
        received = bytearray()
        try:
            while data := await stream.receive_some(65536):
                received += data
        except trio.BrokenResourceError:
            pass  # a reset also counts as a cut
        self.received = bytes(received)


def assert_cut_at_deadline(trickler: Trickler) -> None:
    assert trickler.lifetime is not None
    # Never before its deadline; how soon after it is tests/http/test_http_deadlines.py's (MockClock), and a
    # trickler never cut (its payload lasts 400 s) ends in the test's fail_after.
    assert trickler.lifetime >= DEADLINE - 0.05, trickler.lifetime
    if trickler.received:  # a 408 envelope, or nothing at all (a plain close)
        head, _, body = trickler.received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), head[:80]
        assert json.loads(body)["error"]["code"] in ("header_timeout", "body_timeout")


async def test_tricklers_are_cut_at_their_deadline_while_others_are_served(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_server(tiny_model, http_limits=LIMITS, engine_limits=EngineLimits(max_batch=2)) as server:
            heads = [Trickler(server.port, b"", HEAD_FOREVER) for _ in range(ATTACKERS // 2)]
            bodies = [Trickler(server.port, BODY_HEAD, b" " * 4000) for _ in range(ATTACKERS // 2)]
            quiet = LatencyProbe(server.port)  # the same probes before and after the attack: the baseline
            await quiet.run_quietly(PROBE_INTERVAL, QUIET_PROBES)
            probe = LatencyProbe(server.port)
            stop_probe = trio.Event()
            served = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe.run, PROBE_INTERVAL, stop_probe)
                async with trio.open_nursery() as attack:
                    for trickler in heads + bodies:
                        attack.start_soon(trickler.run)
                    await wait_until(lambda: server.http.connections >= ATTACKERS)
                    peak_connections = server.http.connections
                    for max_tokens in (2, 3, 4):  # normal clients, while every trickler is still connected
                        served.append(await fetch(server.port, "POST", "/v1/completions",
                                                  completion_json(max_tokens, stream=False)))
                stop_probe.set()
            await wait_until(lambda: server.http.connections == 0)
            await quiet.run_quietly(PROBE_INTERVAL, 2 * QUIET_PROBES)

    lifetimes = sorted(t.lifetime for t in heads + bodies)
    print(f"slowloris: peak {peak_connections} connections, cut after {lifetimes[0]:.2f}..{lifetimes[-1]:.2f} s, "
          f"/health p90 {probe.quantile(0.9) * 1000:.1f} ms max {max(probe.samples) * 1000:.1f} ms "
          f"over {len(probe.samples)} probes; without tricklers p90 {quiet.quantile(0.9) * 1000:.1f} ms "
          f"max {max(quiet.samples) * 1000:.1f} ms")
    assert peak_connections >= ATTACKERS
    assert [r.status for r in served] == [200, 200, 200]
    assert [r.json()["usage"]["completion_tokens"] for r in served] == [2, 3, 4]
    for trickler in heads + bodies:
        assert_cut_at_deadline(trickler)
    assert sum(t.received.startswith(b"HTTP/1.1 408") for t in heads + bodies) >= ATTACKERS // 2
    assert not probe.failures, probe.failures[:3]
    assert len(probe.samples) >= 5 and len(quiet.samples) >= 2 * QUIET_PROBES and not quiet.failures
    assert probe.quantile(0.9) < LATENCY_RATIO * quiet.quantile(0.9), (sorted(probe.samples)[-5:],
                                                                         sorted(quiet.samples)[-5:])
