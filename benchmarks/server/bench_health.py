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
import importlib.metadata
import math
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules
from _health_clients import (  # noqa: E402
    METRICS, LatencyResult, ThroughputResult, in_client_process, latency_client, throughput_client, wrk_throughput,
)
from _health_servers import (  # noqa: E402
    HEAVY_MODEL, ServerProcess, ensure_heavy_model, http_get, pid_tree, start_hypercorn, start_kestrel,
)


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
                    result = wrk_throughput(port, args.connections, 1.0, args.duration, pid_tree(server.proc.pid))
                else:
                    result = in_client_process(throughput_client, port, args.connections, 1.0, args.duration,
                                               pid_tree(server.proc.pid), timeout=args.duration + 60)
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
    tokens, steps, step_s = (busy.metrics_delta[name] for name in METRICS)
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
