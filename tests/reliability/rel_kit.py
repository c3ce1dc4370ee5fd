"""Test support for the reliability suites: server start-up, raw HTTP clients, latency probes.

Everything talks to a real server on 127.0.0.1 (port 0) over real sockets.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import AsyncIterator, Callable

import attrs
import h11
import trio
from step_gate import StepGate, wait_until  # noqa: F401 (re-exported to the tests)

from kestrel_trio.model import Model
from kestrel_trio.openai import parse_sse
from kestrel_trio.server import Server, serve

HOST = "127.0.0.1"


@contextlib.asynccontextmanager
async def running_server(model: Model, **options) -> AsyncIterator[Server]:
    """``serve(model, host=127.0.0.1, port=0, **options)`` for the duration of the block."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(serve, model, host=HOST, port=0, **options))
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


@attrs.frozen
class RawResponse:
    """A response read off the socket.

    Attributes:
        status: the status code.
        headers: lower-case header name -> value (the last one wins).
        body: the de-chunked body.
    """

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)

    def sse_payloads(self) -> list[str]:
        """The ``data`` payloads of an SSE body (strict framing)."""
        return parse_sse(self.body)


class RawClient:
    """One keep-alive TCP connection speaking HTTP/1.1 through h11's client side."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        return cls(await trio.open_tcp_stream(HOST, port))

    async def send_request(self, method: str, path: str, body: bytes = b"", headers: tuple = ()) -> None:
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        head = [("host", HOST), *headers]
        if method != "GET" or body:
            head.append(("content-length", str(len(body))))
        data = self._h11.send(h11.Request(method=method, target=path, headers=head))
        if body:
            data += self._h11.send(h11.Data(data=body))
        data += self._h11.send(h11.EndOfMessage())
        await self.stream.send_all(data)

    async def _next_event(self):
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._h11.receive_data(await self.stream.receive_some(65536))

    async def read_head(self) -> h11.Response:
        """The next final response head; EOFError if the server closed first."""
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise EOFError("the server closed the connection before a response")

    async def read_body(self, enough: Callable[[bytes], bool] = lambda body: False) -> bytes:
        """Body bytes until the end of the message, or until ``enough(body_so_far)``."""
        body = bytearray()
        while not enough(bytes(body)):
            event = await self._next_event()
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
        return bytes(body)

    async def read_response(self) -> RawResponse:
        head = await self.read_head()
        body = await self.read_body()
        headers = {name.decode(): value.decode("latin-1") for name, value in head.headers}
        return RawResponse(head.status_code, headers, body)

    async def request(self, method: str, path: str, body: bytes = b"", headers: tuple = ()) -> RawResponse:
        await self.send_request(method, path, body, headers)
        return await self.read_response()

    async def aclose(self) -> None:
        await self.stream.aclose()


@contextlib.asynccontextmanager
async def connected(port: int) -> AsyncIterator[RawClient]:
    """A :class:`RawClient` for the duration of the block (closed however it ends)."""
    client = await RawClient.connect(port)
    try:
        yield client
    finally:
        await client.aclose()


async def fetch(port: int, method: str, path: str, obj: object = None, headers: tuple = ()) -> RawResponse:
    """One request on a fresh connection; ``obj`` is sent as JSON."""
    body = b"" if obj is None else json.dumps(obj).encode()
    async with connected(port) as client:
        return await client.request(method, path, body, headers)


def event_count(body: bytes) -> int:
    """Complete SSE events in ``body`` so far."""
    return body.count(b"\n\n")


def completion_json(max_tokens: int, *, stream: bool, prompt: str = "Once upon a time") -> dict:
    """A greedy completion that generates exactly ``max_tokens`` tokens (EOS ignored)."""
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}


def chat_json(max_tokens: int, *, stream: bool) -> dict:
    """A greedy chat request that generates exactly ``max_tokens`` tokens (EOS ignored)."""
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def assert_envelope(response: RawResponse, status: int) -> dict:
    """An OpenAI error envelope with ``status``; returns its ``error`` object."""
    assert response.status == status, (response.status, response.body[:300])
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


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
