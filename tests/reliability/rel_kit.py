"""Test support for the reliability suites: server start-up, raw HTTP clients, latency probes.

Everything talks to a real server on 127.0.0.1 (port 0) over real sockets.
"""

from __future__ import annotations

import json
import os

import h11
import trio
from step_gate import StepGate, wait_until  # noqa: F401 (re-exported to the tests)


from server_kit import (  # noqa: F401 (re-exported to the tests)
    HOST, RawClient, RawResponse, assert_envelope, connected, event_count, fetch, running_server,
)


def completion_json(max_tokens: int, *, stream: bool, prompt: str = "Once upon a time") -> dict:
    """A greedy completion that generates exactly ``max_tokens`` tokens (EOS ignored)."""
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}


def chat_json(max_tokens: int, *, stream: bool) -> dict:
    """A greedy chat request that generates exactly ``max_tokens`` tokens (EOS ignored)."""
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def assert_stream_complete(response: RawResponse) -> None:
    """A 200 SSE stream that ends with a finish chunk (or an error event) and ``[DONE]``."""
    assert response.status == 200, response.body[:300]
    payloads = response.sse_payloads()
    assert payloads[-1] == "[DONE]", payloads[-3:]
    last = json.loads(payloads[-2])
    assert "error" in last or last["choices"][0]["finish_reason"] is not None, last


class LatencyProbe:
    """Times ``GET /health`` on fresh connections, issued on a fixed schedule.

    Each sample runs from the request's scheduled time, not from when the
    event loop got round to sending it: an external client would have sent it
    on time, so a stalled event loop shows up as latency.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.samples: list[float] = []  # s
        self.failures: list[str] = []

    async def probe_once(self, scheduled: float) -> None:
        try:
            response = await fetch(self.port, "GET", "/health")
        except (OSError, EOFError, trio.BrokenResourceError, h11.ProtocolError) as exc:
            self.failures.append(repr(exc))
            return
        self.samples.append(trio.current_time() - scheduled)
        if response.status != 200:
            self.failures.append(f"/health answered {response.status}")

    async def run(self, interval: float, stop: trio.Event) -> None:
        """Probe every ``interval`` seconds until ``stop`` is set."""
        scheduled = trio.current_time()
        while not stop.is_set():
            await self.probe_once(scheduled)
            # The next request is due one interval after the last one was; if that time has
            # passed (a stall), it was due then, and the schedule restarts from now.
            scheduled += interval
            if scheduled < trio.current_time():
                await self.probe_once(scheduled)
                scheduled = trio.current_time() + interval
            with trio.move_on_at(scheduled):
                await stop.wait()

    async def run_quietly(self, interval: float, count: int) -> None:
        """``count`` probes, one every ``interval`` seconds, with nothing else going on: a baseline of this run."""
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.run, interval, stop)
            while len(self.samples) + len(self.failures) < count:
                await trio.sleep(interval)
            stop.set()

    def quantile(self, q: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_bytes() -> int:
    """This process's resident set size, in bytes (Linux /proc)."""
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def task_count() -> int:
    """Tasks alive in this trio run (the whole task tree from the root)."""
    pending = [trio.lowlevel.current_root_task()]
    count = 0
    while pending:
        task = pending.pop()
        count += 1
        for nursery in task.child_nurseries:
            pending.extend(nursery.child_tasks)
    return count


async def abort(stream: trio.SocketStream) -> None:
    """Close ``stream`` with a TCP reset (SO_LINGER 0), as a crashed client would."""
    import socket
    import struct

    stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()
