"""bench_health.py's load generator and latency probe, each run in a process of its own (``in_client_process``):
raw HTTP/1.1 GET /health back to back on keep-alive connections (or wrk), and /health probed at a fixed rate while
a streaming completion runs.

Durations and latencies are seconds; rates are requests per second.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import re
import resource
import subprocess
import time

import attrs
import trio

from _health_servers import HOST, cpu_seconds

_HEALTH_REQUEST = f"GET /health HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
_MAX_READS = 10_000  # receive_some calls per response before giving up
_MAX_REQUESTS = 10_000_000  # per connection; the time budget ends it long before
_MAX_RECONNECTS = 1_000


# ---------------------------------------------------------------- HTTP/1.1 client and load generator


async def _receive_into(stream: trio.SocketStream, buf: bytearray) -> None:
    data = await stream.receive_some(65536)
    if not data:
        raise ConnectionError("the server closed the connection in the middle of a response")
    buf += data


async def read_response(stream: trio.SocketStream, buf: bytearray) -> tuple[int, bool, bytes]:
    """One Content-Length-framed response from ``stream``; ``buf`` keeps any bytes after it.

    Returns:
        (status code, whether the connection stays open, body bytes).
    """
    for _ in range(_MAX_READS):
        head_end = buf.find(b"\r\n\r\n")
        if head_end >= 0:
            break
        await _receive_into(stream, buf)
    else:
        raise ConnectionError("no complete response head")
    status_line, *lines = bytes(buf[:head_end]).decode("latin-1").split("\r\n")
    status, keep_alive, length = int(status_line.split(" ", 2)[1]), status_line.startswith("HTTP/1.1"), None
    for line in lines:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "connection" and "close" in value.lower():
            keep_alive = False
        elif name == "transfer-encoding":
            raise ConnectionError(f"expected a Content-Length response, got Transfer-Encoding: {value.strip()}")
    if length is None:
        raise ConnectionError("response without Content-Length")
    end = head_end + 4 + length
    for _ in range(_MAX_READS):
        if len(buf) >= end:
            break
        await _receive_into(stream, buf)
    body = bytes(buf[head_end + 4:end])
    del buf[:end]
    return status, keep_alive, body


@attrs.define
class _Tally:
    ok: int = 0
    other: int = 0
    reconnects: int = 0


async def _hammer(port: int, window_start: float, tally: _Tally) -> None:
    """GET /health back to back on keep-alive connections; count responses after ``window_start``."""
    for _ in range(_MAX_RECONNECTS):
        async with await trio.open_tcp_stream(HOST, port) as stream:
            buf = bytearray()
            for _ in range(_MAX_REQUESTS):
                await stream.send_all(_HEALTH_REQUEST)
                status, keep_alive, _ = await read_response(stream, buf)
                if trio.current_time() >= window_start:
                    if status == 200:
                        tally.ok += 1
                    else:
                        tally.other += 1
                if not keep_alive:
                    break
        tally.reconnects += 1


@attrs.frozen
class ThroughputResult:
    """Counted /health responses over the window (``duration`` s)."""

    ok: int
    other: int
    reconnects: int
    duration: float
    server_cpu: float  # CPU seconds of the server's process tree during the window
    client_cpu: float  # CPU seconds of the load generator during the window

    @property
    def rate(self) -> float:
        return self.ok / self.duration

    @property
    def per_server_cpu_second(self) -> float:
        """Responses per CPU-second the server used: less sensitive than ``rate`` to other load."""
        return self.ok / max(self.server_cpu, 1e-9)


def throughput_client(port: int, connections: int, warmup: float, duration: float,
                      server_pids: list[int]) -> ThroughputResult:
    """Load-generator entry point (own process): ``connections`` hammering tasks for warmup + duration s."""

    async def run() -> ThroughputResult:
        tally, marks = _Tally(), {}

        async def mark_window_start(when: float) -> None:
            await trio.sleep_until(when)
            marks["start"] = (cpu_seconds(server_pids), time.process_time())

        window_start = trio.current_time() + warmup
        with trio.move_on_at(window_start + duration):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(mark_window_start, window_start)
                for _ in range(connections):
                    nursery.start_soon(_hammer, port, window_start, tally)
        server0, client0 = marks["start"]
        return ThroughputResult(tally.ok, tally.other, tally.reconnects, duration,
                                cpu_seconds(server_pids) - server0, time.process_time() - client0)

    return trio.run(run)


_WRK_TOTAL = re.compile(r"(\d+) requests in ([\d.]+)(m?s)")
_WRK_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")


def wrk_throughput(port: int, connections: int, warmup: float, duration: float,
                   server_pids: list[int]) -> ThroughputResult:
    """The same measurement with wrk (C, one thread) as the load generator, so the client is not the bottleneck."""
    url = f"http://{HOST}:{port}/health"
    subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(warmup))}s", url],
                   check=True, capture_output=True, timeout=warmup + 30)
    server0, client0 = cpu_seconds(server_pids), _children_cpu_seconds()
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", url],
                         check=True, capture_output=True, text=True, timeout=duration + 30).stdout
    server_cpu, client_cpu = cpu_seconds(server_pids) - server0, _children_cpu_seconds() - client0
    total = _WRK_TOTAL.search(out)
    if total is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    seconds = float(total.group(2)) / (1000.0 if total.group(3) == "ms" else 1.0)
    non_2xx = _WRK_NON_2XX.search(out)
    other = int(non_2xx.group(1)) if non_2xx else 0
    return ThroughputResult(int(total.group(1)) - other, other, 0, seconds, server_cpu, client_cpu)


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------- latency while generating


@attrs.define
class _SseLog:
    arrivals: list = attrs.Factory(list)  # (trio time, data events in that read)
    first_event: trio.Event = attrs.Factory(trio.Event)
    done: bool = False
    head: bytes = b""


async def _stream_completion(port: int, model_id: str, max_tokens: int, log: _SseLog) -> None:
    """POST a streaming completion and note when its SSE data events arrive."""
    body = json.dumps({"model": model_id, "prompt": "Once upon a time", "max_tokens": max_tokens,
                       "temperature": 0, "stream": True}).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    marker = b"data: {"
    try:
        async with await trio.open_tcp_stream(HOST, port) as stream:
            await stream.send_all(request)
            tail = b""
            for _ in range(max_tokens * 4 + 100):
                data = await stream.receive_some(65536)
                log.head = log.head or data[:300]
                if not data or not log.head.startswith(b"HTTP/1.1 200"):
                    break
                text = tail + data
                count = text.count(marker)  # tail is shorter than the marker, so nothing is counted twice
                if count:
                    log.arrivals.append((trio.current_time(), count))
                    log.first_event.set()
                if b"data: [DONE]" in text:
                    break
                tail = text[-(len(marker) - 1):]
    finally:
        log.done = True
        log.first_event.set()  # also when it failed, so the waiter sees it


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else math.nan


# The /metrics counters read before and after a probing window.
METRICS = ("kestrel:generation_tokens_total", "kestrel:model_steps_total", "kestrel:model_step_seconds_sum")


async def _get(stream: trio.SocketStream, buf: bytearray, path: str) -> tuple[int, bytes]:
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
    status, _, body = await read_response(stream, buf)
    return status, body


@attrs.frozen
class LatencyResult:
    """/health latencies (s) over one probing window, and what the engine did meanwhile."""

    latencies: list
    statuses: dict
    window: float  # s
    sse_events: int  # data events received during the window (about one per token)
    stream_running_at_end: bool
    metrics_delta: dict  # change of each METRICS counter over the window
    first_event_wait: float  # s from the POST to the first data event


def latency_client(port: int, model_id: str, duration: float, rate: float, generate: bool,
                   max_tokens: int, first_token_timeout: float) -> LatencyResult:
    """Latency-probe entry point (own process): optionally start a generation, then probe /health."""

    async def run() -> LatencyResult:
        log = _SseLog()
        result = await _probe_window(port, model_id, duration, rate, max_tokens if generate else 0,
                                     first_token_timeout, log)
        if result is None:  # raised here, outside the nursery, so it is not wrapped in an exception group
            raise RuntimeError(f"the completion stream sent no events; it began with {log.head!r}")
        return result

    return trio.run(run)


async def _probe_window(port: int, model_id: str, duration: float, rate: float, max_tokens: int,
                        first_token_timeout: float, log: _SseLog) -> LatencyResult | None:
    """Probe /health for ``duration`` s, during a generation of ``max_tokens`` unless 0; None if it never began."""
    posted = trio.current_time()
    async with trio.open_nursery() as nursery:
        if max_tokens:
            nursery.start_soon(_stream_completion, port, model_id, max_tokens, log)
            with trio.fail_after(first_token_timeout):
                await log.first_event.wait()
            if not log.arrivals:
                nursery.cancel_scope.cancel()
                return None
        first_wait = trio.current_time() - posted
        async with await trio.open_tcp_stream(HOST, port) as stream:
            buf = bytearray()
            for _ in range(5):  # warm the connection and the route
                await _get(stream, buf, "/health")
            before = (await _get(stream, buf, "/metrics"))[1].decode()
            start = trio.current_time()
            latencies, statuses = await _probe(stream, buf, duration, rate)
            end = trio.current_time()
            after = (await _get(stream, buf, "/metrics"))[1].decode()
        running = bool(max_tokens) and not log.done
        nursery.cancel_scope.cancel()  # closing the stream abandons the generation
    events = sum(n for when, n in log.arrivals if start <= when < end)
    delta = {name: _metric(after, name) - _metric(before, name) for name in METRICS}
    return LatencyResult(latencies, statuses, end - start, events, running, delta, first_wait)


async def _probe(stream: trio.SocketStream, buf: bytearray, duration: float, rate: float) -> tuple[list, dict]:
    """GET /health every 1/rate s (sequentially, one connection); each latency in s."""
    start, latencies, statuses = trio.current_time(), [], {}
    for i in range(max(1, round(duration * rate))):
        await trio.sleep_until(start + i / rate)
        with trio.fail_after(30):
            began = time.perf_counter()
            await stream.send_all(_HEALTH_REQUEST)
            status, keep_alive, _ = await read_response(stream, buf)
            latencies.append(time.perf_counter() - began)
        statuses[status] = statuses.get(status, 0) + 1
        if not keep_alive:
            raise ConnectionError("the server closed the probing connection")
    return latencies, statuses


def in_client_process(function, *args, timeout: float):
    """Run ``function(*args)`` in a fresh spawned process of ours; its return value."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply_async(function, args).get(timeout)
