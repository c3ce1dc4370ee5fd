"""/health throughput against a minimal hypercorn app, and /health latency while a generation runs.

Usage:
    pip install -e '.[bench]'        # hypercorn, threadpoolctl
    apt-get install wrk               # optional: part 1's load generator (else a trio client)
    python benchmarks/server/bench_health.py [--connections 8] [--duration 5] [--rounds 3] [--rate 20] [--model DIR]

Part 1 starts an idle kestrel-trio server (built-in demo model) and a one-worker
hypercorn app (trio worker class, benchmarks/server/hypercorn_health_app.py) serving
the same JSON body, each in its own subprocess, and drives each from a separate
load-generator process: ``--connections`` keep-alive connections sending raw
HTTP/1.1 ``GET /health`` back to back, 1 s of warm-up, then ``--duration``
seconds counted; ``--rounds`` such runs per server, taken in turn, and the
medians compared (the 2 cores may be shared with other work, so each run also
reports the server's CPU use and requests per server CPU-second). kestrel-trio
runs with ``--log-level WARNING`` for the comparison, since hypercorn has no
access log by default; a third server shows the cost of kestrel-trio's default
INFO access log. Target: kestrel / hypercorn >= 1.5x (median requests/s).

Part 2 starts kestrel-trio on a heavy model (by default a random checkpoint with
Qwen3-0.6B's exact shapes, built once into ~/.cache/kestrel-trio-bench), probes
/health ``--rate`` times a second on one keep-alive connection while idle, then
again while a long streaming completion is being generated, and reports the
latency percentiles plus the tokens and step times of the generation during the
window. Target: p99 < 50 ms while generating.

All processes are this script's own, on 127.0.0.1; each is ended by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import importlib.metadata
import json
import math
import multiprocessing
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs
import trio

HOST = "127.0.0.1"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # benchmarks/: the shared modules
HEAVY_MODEL = Path.home() / ".cache" / "kestrel-trio-bench" / "qwen3-0.6b-shapes-bf16"
_READY_LINE = re.compile(r"serving (\S+) at http://127\.0\.0\.1:(\d+)/v1")
_HEALTH_REQUEST = f"GET /health HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
_MAX_READS = 10_000  # receive_some calls per response before giving up
_MAX_REQUESTS = 10_000_000  # per connection; the time budget ends it long before
_MAX_RECONNECTS = 1_000
_TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- server processes


def _pid_tree(root: int) -> list[int]:
    """``root`` and its live descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo and len(tree) < 1000:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by ``pids`` (exited ones count 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / _TICK


class ServerProcess:
    """A server subprocess of ours; stderr goes to a temporary log file.

    Args:
        argv: the command line.
        env: extra environment variables.
    """

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="bench_health_", suffix=".log")[1])
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                         env={**os.environ, **(env or {})}, cwd=REPO)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def wait_for_log(self, pattern: re.Pattern, timeout: float) -> re.Match:
        """The first match of ``pattern`` in stderr, polling for up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = pattern.search(self.log_path.read_text(errors="replace"))
            if match:
                return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"server did not get ready (exit code {self.proc.poll()}):\n{self.log_tail()}")

    def wait_for_health(self, port: int, timeout: float) -> None:
        """Poll GET /health until it answers 200, for up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if http_get(port, "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server did not get ready (exit code {self.proc.poll()}):\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` s; leftover descendants are killed by PID."""
        tree = _pid_tree(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        for pid in tree[1:]:
            if Path(f"/proc/{pid}").exists():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.log_path.unlink(missing_ok=True)


def start_kestrel(model: Path | None, log_level: str, timeout: float) -> tuple[ServerProcess, str, int]:
    """A kestrel-trio server on a free port; returns it, its model id and its port."""
    argv = [sys.executable, "-m", "kestrel_trio.cli", "--log-level", log_level, "serve", "--port", "0"]
    if model is not None:
        argv += ["--model", str(model)]
    server = ServerProcess(argv)
    try:
        match = server.wait_for_log(_READY_LINE, timeout)
    except BaseException:
        server.stop()
        raise
    return server, match.group(1), int(match.group(2))


def start_hypercorn(body: bytes, timeout: float) -> tuple[ServerProcess, int]:
    """The minimal hypercorn app (one trio worker) on a free port, answering ``body``."""
    with socket.socket() as probe:  # a free port; the tiny race until hypercorn binds it is acceptable here
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "hypercorn", "--worker-class", "trio", "--workers", "1",
            "--bind", f"{HOST}:{port}", f"{HERE / 'hypercorn_health_app.py'}:app"]
    server = ServerProcess(argv, env={"HEALTH_BODY": body.decode()})
    try:
        server.wait_for_health(port, timeout)
    except BaseException:
        server.stop()
        raise
    return server, port


def http_get(port: int, path: str) -> tuple[int, bytes]:
    """A blocking GET on a fresh connection: (status, body)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# ---------------------------------------------------------------- HTTP/1.1 client (runs in the client process)


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
            marks["start"] = (_cpu_seconds(server_pids), time.process_time())

        window_start = trio.current_time() + warmup
        with trio.move_on_at(window_start + duration):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(mark_window_start, window_start)
                for _ in range(connections):
                    nursery.start_soon(_hammer, port, window_start, tally)
        server0, client0 = marks["start"]
        return ThroughputResult(tally.ok, tally.other, tally.reconnects, duration,
                                _cpu_seconds(server_pids) - server0, time.process_time() - client0)

    return trio.run(run)


_WRK_TOTAL = re.compile(r"(\d+) requests in ([\d.]+)(m?s)")
_WRK_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")


def wrk_throughput(port: int, connections: int, warmup: float, duration: float,
                   server_pids: list[int]) -> ThroughputResult:
    """The same measurement with wrk (C, one thread) as the load generator, so the client is not the bottleneck."""
    url = f"http://{HOST}:{port}/health"
    subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(warmup))}s", url],
                   check=True, capture_output=True, timeout=warmup + 30)
    server0, client0 = _cpu_seconds(server_pids), _children_cpu_seconds()
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", url],
                         check=True, capture_output=True, text=True, timeout=duration + 30).stdout
    server_cpu, client_cpu = _cpu_seconds(server_pids) - server0, _children_cpu_seconds() - client0
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


# ---------------------------------------------------------------- latency while generating (client process)


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


_METRICS = ("kestrel:generation_tokens_total", "kestrel:model_steps_total", "kestrel:model_step_seconds_sum")


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
    metrics_delta: dict  # change of each _METRICS counter over the window
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
    delta = {name: _metric(after, name) - _metric(before, name) for name in _METRICS}
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


# ---------------------------------------------------------------- heavy model


def ensure_heavy_model(folder: Path) -> None:
    """Build the Qwen3-0.6B-shaped random checkpoint (BF16) unless present, and give it a tokenizer."""
    import kestrel_trio

    if not ((folder / "config.json").exists() and (folder / "model.safetensors").exists()):
        from _checkpoints import QWEN3_0_6B
        from kestrel_trio._model import write_random_checkpoint

        print(f"building {folder} (once; about 1.2 GB)", flush=True)
        partial = folder.with_name(folder.name + ".partial")
        write_random_checkpoint(partial, QWEN3_0_6B, seed=0, dtype="BF16", std=0.02)
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("model.safetensors", "config.json"):  # config.json last: its presence means complete
            os.replace(partial / name, folder / name)
        shutil.rmtree(partial)
    demo = Path(kestrel_trio.__file__).resolve().parent / "_demo"
    if not (folder / "tokenizer.json").exists():
        with gzip.open(demo / "tokenizer.json.gz", "rb") as src, open(folder / "tokenizer.json.partial", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(folder / "tokenizer.json.partial", folder / "tokenizer.json")
    for name in ("tokenizer_config.json", "generation_config.json"):
        if not (folder / name).exists():
            shutil.copyfile(demo / name, folder / name)


# ---------------------------------------------------------------- report


def _median(values: list) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _percentile(values: list, fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def _throughput_line(label: str, result: ThroughputResult) -> str:
    extra = f"; {result.other} non-200" if result.other else ""
    extra += f"; {result.reconnects} reconnects" if result.reconnects else ""
    return (f"  {label:<53} {result.rate:>6.0f} req/s  (server CPU {100 * result.server_cpu / result.duration:.0f}%, "
            f"load generator CPU {100 * result.client_cpu / result.duration:.0f}% of one core{extra})")


def _latency_line(label: str, result: LatencyResult) -> str:
    ms = [s * 1000 for s in result.latencies]
    statuses = ", ".join(f"{n} x {code}" for code, n in sorted(result.statuses.items()))
    return (f"  {label:<18} n={len(ms):<4} p50 {_percentile(ms, 0.5):7.2f} ms   p99 {_percentile(ms, 0.99):7.2f} ms"
            f"   max {max(ms):7.2f} ms   ({statuses})")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _blas_note() -> str:
    try:
        import numpy  # noqa: F401  (threadpoolctl only sees libraries already loaded)
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    pools = [f"{p['internal_api']} {p.get('version')}, {p['num_threads']} threads" for p in threadpool_info()]
    return "; ".join(pools) or "none found"


# ---------------------------------------------------------------- main


def part_throughput(args: argparse.Namespace) -> None:
    generator = "wrk (one thread)" if args.load_generator == "wrk" else "the trio load generator"
    print(f"\n1) /health throughput: {args.connections} keep-alive connections, raw HTTP/1.1 GET back to back, "
          f"1 s warm-up + {args.duration:g} s counted,\n   {args.rounds} rounds taken in turn (median reported); "
          f"each server in its own subprocess, {generator} in another; all share the "
          f"{os.cpu_count()} cores", flush=True)
    with contextlib.ExitStack() as stack:
        servers = _start_throughput_servers(stack)
        results: dict[str, list[ThroughputResult]] = {label: [] for label in servers}
        for round_number in range(1, args.rounds + 1):
            for label, (server, port) in servers.items():
                if args.load_generator == "wrk":
                    result = wrk_throughput(port, args.connections, 1.0, args.duration, _pid_tree(server.proc.pid))
                else:
                    result = in_client_process(throughput_client, port, args.connections, 1.0, args.duration,
                                               _pid_tree(server.proc.pid), timeout=args.duration + 60)
                results[label].append(result)
                print(_throughput_line(f"round {round_number}: {label}", result), flush=True)
    print("  medians:")
    for label, runs in results.items():
        print(f"    {label:<44} {_median([r.rate for r in runs]):>7.0f} req/s, "
              f"{_median([r.per_server_cpu_second for r in runs]):>7.0f} req per server CPU-second")
    kestrel, hypercorn = (results[label] for label in list(servers)[:2])
    if any(r.reconnects for r in hypercorn):
        print("  (hypercorn closes a keep-alive connection after 1000 requests by default; the client reconnects)")
    ratio = _median([r.rate for r in kestrel]) / _median([r.rate for r in hypercorn])
    cpu_ratio = (_median([r.per_server_cpu_second for r in kestrel])
                 / _median([r.per_server_cpu_second for r in hypercorn]))
    print(f"  ratio kestrel-trio / hypercorn: {ratio:.2f}x req/s (target >= 1.5x) {_verdict(ratio >= 1.5)}; "
          f"{cpu_ratio:.2f}x per server CPU-second", flush=True)


def _start_throughput_servers(stack: contextlib.ExitStack) -> dict[str, tuple[ServerProcess, int]]:
    """kestrel-trio (WARNING), hypercorn (same body) and kestrel-trio (INFO), idle, by label."""
    quiet, _, quiet_port = start_kestrel(None, "WARNING", timeout=60)
    stack.enter_context(quiet)
    status, body = http_get(quiet_port, "/health")
    hypercorn, hypercorn_port = start_hypercorn(body, timeout=60)
    stack.enter_context(hypercorn)
    same = http_get(hypercorn_port, "/health") == (status, body)
    print(f"  /health body: {len(body)} bytes, {'identical' if same else 'DIFFERENT'} from both: {body.decode()}")
    verbose, _, verbose_port = start_kestrel(None, "INFO", timeout=60)
    stack.enter_context(verbose)
    return {
        "kestrel-trio (log level WARNING)": (quiet, quiet_port),
        f"hypercorn {importlib.metadata.version('hypercorn')} (trio worker, 1 worker)": (hypercorn, hypercorn_port),
        "kestrel-trio (default INFO access log)": (verbose, verbose_port),
    }


def part_latency(args: argparse.Namespace) -> None:
    model = args.model
    if model is None:
        model = HEAVY_MODEL
        ensure_heavy_model(model)
    print(f"\n2) /health latency: {args.rate:g} requests/s, sequential on one keep-alive connection, "
          f"{args.duration:g} s per window\n   server: kestrel-trio --model {model} (default INFO log level)",
          flush=True)
    started = time.monotonic()
    server, model_id, port = start_kestrel(model, "INFO", timeout=300)
    with server:
        print(f"  model {model_id} ready in {time.monotonic() - started:.1f} s", flush=True)
        idle = in_client_process(latency_client, port, model_id, args.duration, args.rate, False, args.max_tokens,
                                 60.0, timeout=args.duration + 60)
        print(_latency_line("idle:", idle), flush=True)
        busy = in_client_process(latency_client, port, model_id, args.duration, args.rate, True, args.max_tokens,
                                 120.0, timeout=args.duration + 180)
        print(_latency_line("generating:", busy), flush=True)
    p99_ms = _percentile(busy.latencies, 0.99) * 1000
    tokens, steps, step_s = (busy.metrics_delta[name] for name in _METRICS)
    print(f"  p99 while generating: {p99_ms:.2f} ms (target < 50 ms) {_verdict(p99_ms < 50)}")
    print(f"  generation during the {busy.window:.1f} s window: {tokens:.0f} tokens ({steps:.0f} model steps, "
          f"{busy.sse_events} SSE events received), mean step {1000 * step_s / max(steps, 1):.0f} ms, "
          f"{tokens / busy.window:.1f} tokens/s; worker busy {100 * step_s / busy.window:.0f}% of the window;\n"
          f"  first token {busy.first_event_wait:.1f} s after the POST; stream still running at the end: "
          f"{'yes' if busy.stream_running_at_end else 'NO (raise --max-tokens)'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=8, help="load-generator keep-alive connections")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds counted per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="part-1 measurements per server, taken in turn")
    parser.add_argument("--rate", type=float, default=20.0, help="/health probes per second in part 2")
    parser.add_argument("--model", type=Path, default=None, help=f"heavy checkpoint folder (default {HEAVY_MODEL})")
    parser.add_argument("--max-tokens", type=int, default=2048, help="max_tokens of the part-2 generation")
    parser.add_argument("--load-generator", choices=["auto", "wrk", "python"], default="auto",
                        help="part 1's client: wrk (Debian package) when installed, else a trio client (default auto)")
    parser.add_argument("--parts", nargs="+", choices=["throughput", "latency"], default=["throughput", "latency"])
    args = parser.parse_args()
    if args.load_generator == "auto":
        args.load_generator = "wrk" if shutil.which("wrk") else "python"
    print(f"machine: {os.cpu_count()} cores, shared by the server, the load generator and the model's BLAS threads "
          f"(numpy BLAS: {_blas_note()})")
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    if "throughput" in args.parts:
        part_throughput(args)
    if "latency" in args.parts:
        part_latency(args)
    print("\nload average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
