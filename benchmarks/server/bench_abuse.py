"""Abuse benchmarks at the issue's sizes, against a real ``kestrel-trio serve`` process.

Usage:
    python benchmarks/server/bench_abuse.py [--suite all|slowloris|storm|overload|soak|shutdown] [--model DIR]

Each suite starts its own server subprocess (the built-in demo model unless
--model is given) on 127.0.0.1, attacks it from this process over real
sockets, and prints figures: connections held, requests served, /health
latency under attack (p50/p99/max, measured from each probe's scheduled send
time, by a probe in a process of its own so that the attack's event loop
does not delay it), the server's RSS before and after, and a PASS/FAIL line per criterion
of issue #5. Every suite is bounded in count and time. The CI versions of the
same attacks are in tests/reliability/.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

# The attack clients are the CI suites' own (tests/reliability/rel_kit.py).
sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "tests"),
                str(Path(__file__).resolve().parents[2] / "tests" / "reliability")]
from rel_kit import (
    HOST,
    LatencyProbe,
    RawClient,
    abort,
    chat_json,
    completion_json,
    connected,
    event_count,
    fetch,
)

SERVE = [sys.executable, "-m", "kestrel_trio.cli", "--log-level", "INFO", "serve", "--port", "0"]
READY = re.compile(r"serving \S+ at http://[^:]+:(\d+)/v1")
HEALTH_BUDGET = 0.050  # s


class ServerProcess:
    """A ``kestrel-trio serve`` subprocess with its log in a temporary file."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.log_path = Path(tempfile.mkstemp(prefix="kestrel-bench-", suffix=".log")[1])
        self.process: trio.Process | None = None
        self.port = 0

    async def start(self) -> ServerProcess:
        self._log = open(self.log_path, "wb")
        self.process = await trio.lowlevel.open_process(SERVE + self.args, stdout=self._log, stderr=self._log)
        with trio.fail_after(120):
            while not (match := READY.search(self.log())):
                if self.process.poll() is not None:
                    raise RuntimeError(f"the server exited: {self.log()[-2000:]}")
                await trio.sleep(0.05)
        self.port = int(match.group(1))
        return self

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def rss_mib(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return kib / 1024

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(60):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
        self._log.close()
        self.log_path.unlink()
        return self.process.returncode


def _probe_for(port: int, interval: float, duration: float) -> LatencyProbe:
    """Entry point of the probe process: a LatencyProbe run for ``duration`` seconds."""

    async def run() -> LatencyProbe:
        probe, stop = LatencyProbe(port), trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe.run, interval, stop)
            await trio.sleep(duration)
            stop.set()
        return probe

    return trio.run(run)


async def probe_in_own_process(port: int, interval: float, duration: float) -> LatencyProbe:
    """Probe /health from a separate process, so that the attack's own event loop (hundreds of
    trickling connections in this process) never delays a probe: only the server's delays count."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        pending = pool.apply_async(_probe_for, (port, interval, duration))
        return await trio.to_thread.run_sync(pending.get, duration + 60)


def latency_line(probe: LatencyProbe) -> str:
    ms = sorted(sample * 1000 for sample in probe.samples)
    return (f"/health under attack: {len(ms)} probes, p50 {statistics.median(ms):.1f} ms, "
            f"p99 {probe.quantile(0.99) * 1000:.1f} ms, max {ms[-1]:.1f} ms, failures {len(probe.failures)}")


def verdict(name: str, ok: bool, detail: str = "") -> None:
    print(f"  [{'PASS' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}")


async def metric_values(port: int, name: str) -> dict[str, float]:
    """Samples of one Prometheus metric from /metrics, by label text."""
    text = (await fetch(port, "GET", "/metrics")).body.decode()
    return {labels or "": float(value) for labels, value in re.findall(
        rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, flags=re.MULTILINE)}


# ---- slowloris ------------------------------------------------------------------


async def trickle(port: int, prefix: bytes, payload: bytes, interval: float, record: list, held: list) -> None:
    stream = await trio.open_tcp_stream(HOST, port)
    started = trio.current_time()
    held[0] += 1
    held[1] = max(held[1], held[0])
    received = bytearray()

    async def send_slowly() -> None:
        try:
            await stream.send_all(prefix)
            for index in range(len(payload)):
                await stream.send_all(payload[index:index + 1])
                await trio.sleep(interval)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(send_slowly)
        try:
            while data := await stream.receive_some(65536):
                received += data
        except trio.BrokenResourceError:
            pass
        nursery.cancel_scope.cancel()
    held[0] -= 1
    record.append((trio.current_time() - started, bytes(received[:12])))


async def bench_slowloris(args: argparse.Namespace) -> None:
    deadline = args.deadline
    server = await ServerProcess(["--max-connections", str(args.connections + 64), "--header-timeout", str(deadline),
                                  "--body-timeout", str(deadline), *args.model_args]).start()
    rss_before = server.rss_mib()
    record: list = []
    held = [0, 0]
    served = 0
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 8000
    body_head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 8000\r\n\r\n")
    async with trio.open_nursery() as attack:
        for index in range(args.connections):
            prefix, payload = (b"", head) if index % 2 else (body_head, b" " * 8000)
            attack.start_soon(trickle, server.port, prefix, payload, 0.2, record, held)
        # Phase 1: only the tricklers and the probe. Phase 2: normal completions run too, one at a time.
        # The probe runs in its own process (see probe_in_own_process), from the first connection on.
        quiet_probe = await probe_in_own_process(server.port, 0.02, deadline * 0.4)
        results: dict = {}

        async def probe_phase_two() -> None:
            results["busy"] = await probe_in_own_process(server.port, 0.02, deadline * 0.4)

        async with trio.open_nursery() as phase:
            phase.start_soon(probe_phase_two)
            while held[0] > 0:
                response = await fetch(server.port, "POST", "/v1/completions", completion_json(4, stream=False))
                served += response.status == 200
        busy_probe = results["busy"]
    rss_after = server.rss_mib()
    await server.stop()
    lifetimes = sorted(lifetime for lifetime, _ in record)
    answered_408 = sum(start.startswith(b"HTTP/1.1 408") for _, start in record)
    print(f"slowloris: {args.connections} connections (half trickling heads, half bodies), deadline {deadline} s")
    print(f"  connections held at once: {held[1]}; cut after {lifetimes[0]:.2f} / {statistics.median(lifetimes):.2f} "
          f"/ {lifetimes[-1]:.2f} s (min/median/max); {answered_408} got a 408, the rest a close")
    print(f"  normal completions served during the attack: {served}")
    print(f"  tricklers only: {latency_line(quiet_probe)}")
    print(f"  tricklers + completions: {latency_line(busy_probe)}")
    print(f"  server RSS: {rss_before:.1f} MiB before, {rss_after:.1f} MiB after")
    verdict("every trickler cut at its deadline", lifetimes[-1] < deadline + 2.0, f"max {lifetimes[-1]:.2f} s")
    for name, probe in (("tricklers only", quiet_probe), ("tricklers + completions", busy_probe)):
        verdict(f"/health p99 < 50 ms ({name})", probe.quantile(0.99) < HEALTH_BUDGET)


# ---- disconnect storm -----------------------------------------------------------


async def storm_client(port: int, index: int, rng: random.Random) -> str:
    leave_after = rng.choice(["sent", "head", 1, 3, 8, 20, "end"])
    client = await RawClient.connect(port)
    body = {"prompt": f"Client {index} says: " + "lorem ipsum " * rng.randint(1, 200), "max_tokens": rng.randint(8, 48),
            "temperature": 0, "ignore_eos": True, "stream": True}
    try:
        await client.send_request("POST", "/v1/completions", json.dumps(body).encode())
        if leave_after != "sent":
            await client.read_head()
        if isinstance(leave_after, int):
            await client.read_body(enough=lambda got: event_count(got) >= leave_after)
        elif leave_after == "end":
            await client.read_body()
    finally:
        if rng.random() < 0.5:
            await abort(client.stream)
        else:
            await client.aclose()
    return str(leave_after)


async def bench_storm(args: argparse.Namespace) -> None:
    server = await ServerProcess(["--max-queued", str(args.clients), *args.model_args]).start()
    await fetch(server.port, "POST", "/v1/completions", completion_json(4, stream=False))
    rss_before = server.rss_mib()
    rng = random.Random(5)
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for index in range(args.clients):
            nursery.start_soon(storm_client, server.port, index, random.Random(rng.random()))
    with trio.fail_after(60):
        while (health := (await fetch(server.port, "GET", "/health")).json())["active"] or health["queued"]:
            await trio.sleep(0.05)
    elapsed = time.perf_counter() - started
    cancelled = await metric_values(server.port, "kestrel:request_cancelled_total")
    finished = await metric_values(server.port, "kestrel:request_success_total")
    failed = await metric_values(server.port, "kestrel:request_failed_total")
    accepted = await metric_values(server.port, "kestrel:request_accepted_total")
    fresh = await fetch(server.port, "POST", "/v1/completions", completion_json(4, stream=False))
    rss_after = server.rss_mib()
    await server.stop()
    print(f"disconnect storm: {args.clients} streaming clients, idle again after {elapsed:.1f} s")
    print(f"  accepted: {sum(accepted.values()):.0f} (the rest left before their request was read); "
          f"cancelled by phase: {cancelled}; finished: {finished}")
    print(f"  server RSS: {rss_before:.1f} MiB before, {rss_after:.1f} MiB after")
    verdict("engine idle afterwards", health["active"] == 0 and health["queued"] == 0)
    ended = sum(cancelled.values()) + sum(finished.values()) + sum(failed.values())
    verdict("every accepted generation ended once", ended == sum(accepted.values()), f"{ended:.0f} ended")
    verdict("a fresh request is served", fresh.status == 200)


# ---- overload -------------------------------------------------------------------


async def overload_client(port: int, index: int, outcomes: list) -> None:
    started = trio.current_time()
    try:
        response = await fetch(port, "POST", "/v1/completions", completion_json(8, stream=index % 2 == 0))
        kind = str(response.status)
        if response.status in (429, 503) and "retry-after" not in response.headers:
            kind += " without Retry-After"
    except (OSError, EOFError, trio.BrokenResourceError) as exc:
        kind = f"no response ({type(exc).__name__})"
    outcomes.append((kind, trio.current_time() - started))


async def bench_overload(args: argparse.Namespace) -> None:
    queue = 16
    flood = 10 * queue
    server = await ServerProcess(["--max-queued", str(queue), "--max-connections", str(args.max_connections),
                                  *args.model_args]).start()
    outcomes: list = []
    with trio.move_on_after(300) as hung:
        async with trio.open_nursery() as nursery:
            for index in range(flood):
                nursery.start_soon(overload_client, server.port, index, outcomes)
    await server.stop()
    kinds = {kind: sum(1 for k, _ in outcomes if k == kind) for kind in sorted({k for k, _ in outcomes})}
    refusals = sorted(t for k, t in outcomes if k.startswith(("429", "503")))
    print(f"overload: {flood} concurrent requests, queue {queue}, max connections {args.max_connections}")
    print(f"  outcomes: {kinds}")
    if refusals:
        print(f"  refusal latency: median {statistics.median(refusals) * 1000:.1f} ms, "
              f"max {refusals[-1] * 1000:.1f} ms")
    verdict("no request hung", not hung.cancelled_caught and len(outcomes) == flood)
    verdict("none without a response", not any(k.startswith("no response") or "without" in k for k in kinds))


# ---- soak -----------------------------------------------------------------------


async def soak_connection(port: int, count: int, rng: random.Random, tally: dict) -> None:
    async with connected(port) as client:
        for _ in range(count):
            kind = rng.choice(["stream", "chat", "completion", "health", "metrics", "bad_json", "unknown"])
            if kind == "stream":
                body = completion_json(3, stream=True, prompt=f"Soak {rng.random()}")
                response = await client.request("POST", "/v1/completions", json.dumps(body).encode())
                ok = response.status == 200 and response.body.endswith(b"data: [DONE]\n\n")
            elif kind == "chat":
                response = await client.request("POST", "/v1/chat/completions",
                                                json.dumps(chat_json(3, stream=False)).encode())
                ok = response.status == 200
            elif kind == "completion":
                body = completion_json(3, stream=False, prompt=f"Soak {rng.random()}")
                ok = (await client.request("POST", "/v1/completions", json.dumps(body).encode())).status == 200
            elif kind in ("health", "metrics"):
                ok = (await client.request("GET", "/" + kind)).status == 200
            elif kind == "bad_json":
                ok = (await client.request("POST", "/v1/completions", b'{"prompt":')).status == 400
            else:
                ok = (await client.request("GET", "/v1/nowhere")).status == 404
            tally[(kind, ok)] = tally.get((kind, ok), 0) + 1


async def soak_round(port: int, total: int, rng: random.Random, tally: dict, connections: int = 16) -> None:
    async with trio.open_nursery() as nursery:
        for index in range(connections):
            nursery.start_soon(soak_connection, port, total // connections + (index < total % connections),
                               random.Random(rng.random()), tally)


async def bench_soak(args: argparse.Namespace) -> None:
    server = await ServerProcess([*args.model_args]).start()
    rng = random.Random(11)
    tally: dict = {}
    warm = args.requests // 10
    started = time.perf_counter()
    await soak_round(server.port, warm, rng, tally)
    rss_warm = server.rss_mib()
    await soak_round(server.port, args.requests - warm, rng, tally)
    elapsed = time.perf_counter() - started
    rss_end = server.rss_mib()
    prefix = await metric_values(server.port, "kestrel:prefix_cache_entries")
    await server.stop()
    bad = {kind: n for (kind, ok), n in tally.items() if not ok}
    growth = (rss_end - rss_warm) / rss_warm
    print(f"soak: {sum(tally.values())} mixed requests on 16 keep-alive connections in {elapsed:.1f} s "
          f"({sum(tally.values()) / elapsed:.0f} req/s)")
    print(f"  wrong answers: {bad or 'none'}; prefix cache entries at the end: {prefix}")
    print(f"  server RSS: {rss_warm:.1f} MiB after warm-up ({warm} requests), {rss_end:.1f} MiB at the end "
          f"({growth:+.1%})")
    verdict("every answer right", not bad)
    verdict("RSS within 5% of warm-up", abs(growth) <= 0.05)


# ---- graceful shutdown ------------------------------------------------------------


async def bench_shutdown(args: argparse.Namespace) -> None:
    grace = 3.0
    server = await ServerProcess(["--grace", str(grace), *args.model_args]).start()
    clients = []
    for max_tokens in (4000, 4000, 4000, 20):
        client = await RawClient.connect(server.port)
        await client.send_request("POST", "/v1/completions",
                                  json.dumps(completion_json(max_tokens, stream=True)).encode())
        await client.read_head()
        clients.append((client, await client.read_body(enough=lambda got: event_count(got) >= 2)))
    signalled = time.perf_counter()
    server.process.send_signal(signal.SIGTERM)
    while "shutting down" not in server.log() and "graceful shutdown" not in server.log():
        await trio.sleep(0.02)
    try:
        late = await trio.open_tcp_stream(HOST, server.port)
        await late.aclose()
        refused = False
    except OSError:
        refused = True
    endings = []
    for client, first in clients:
        body = first + await client.read_body()
        payloads = [p for p in body.decode().split("\n\n") if p]
        last = json.loads(payloads[-2].removeprefix("data: ")) if len(payloads) >= 2 else {}
        endings.append("error" if "error" in last else (last.get("choices") or [{}])[0].get("finish_reason"))
        endings[-1] = f"{endings[-1]} + {'[DONE]' if payloads and payloads[-1] == 'data: [DONE]' else 'no [DONE]'}"
        await client.aclose()
    with trio.move_on_after(grace + 30):
        await server.process.wait()
    code = await server.stop()  # kills it only if it is still running
    print(f"graceful shutdown: SIGTERM with 4 streams running, grace {grace} s")
    print(f"  stream endings: {endings}; exit code {code} after {time.perf_counter() - signalled:.1f} s")
    verdict("new connections refused", refused)
    verdict("every stream finished or ended with an error + [DONE]", all(e.endswith("+ [DONE]") for e in endings))
    verdict("exit code 0", code == 0)


SUITES = {"slowloris": bench_slowloris, "storm": bench_storm, "overload": bench_overload, "soak": bench_soak,
          "shutdown": bench_shutdown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["all", *SUITES], default="all")
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the built-in demo model)")
    parser.add_argument("--connections", type=int, default=500, help="slowloris connections")
    parser.add_argument("--deadline", type=float, default=5.0, help="slowloris header/body deadline (s)")
    parser.add_argument("--clients", type=int, default=100, help="disconnect-storm clients")
    parser.add_argument("--max-connections", type=int, default=128, help="overload: the server's connection limit")
    parser.add_argument("--requests", type=int, default=10_000, help="soak requests")
    args = parser.parse_args()
    args.model_args = ["--model", args.model] if args.model else []
    for name, suite in SUITES.items():
        if args.suite in ("all", name):
            trio.run(suite, args)


if __name__ == "__main__":
    main()
