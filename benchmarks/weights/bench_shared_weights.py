"""Two server processes on one bf16 checkpoint share its memory-mapped weights: RSS and PSS of each.

Usage:
    python benchmarks/weights/bench_shared_weights.py [--model DIR] [--weights bf16|fp32]

Starts two ``kestrel-trio serve --weights MODE`` processes on the same folder
(by default the Qwen3-0.6B-shaped bf16 checkpoint that bench_load.py builds),
waits until both answer /health, and reads /proc/PID/smaps_rollup of each: RSS
counts shared pages in full in every process, PSS divides them among the
processes sharing them, so the combined PSS is what the two really cost. With
``--weights bf16`` the combined PSS should be about one copy of the bf16
weights plus two processes' private memory; with ``fp32`` each process holds
its own float32 copy. Both processes are this script's own and are ended by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DEFAULT_MODEL = Path.home() / ".cache" / "kestrel-trio-bench" / "qwen3-0.6b-shapes-bf16"
_FIELD = re.compile(r"^(Rss|Pss|Pss_File|Pss_Anon|Shared_Clean|Private_Dirty):\s+(\d+) kB", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"server on port {port} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"server on port {port} not healthy after {timeout} s")


def memory(pid: int) -> dict[str, int]:
    """smaps_rollup fields of ``pid`` in bytes."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return {name: int(kb) * 1024 for name, kb in _FIELD.findall(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--weights", choices=["bf16", "fp32"], default="bf16")
    args = parser.parse_args()
    if not (args.model / "config.json").exists():
        raise SystemExit(f"{args.model}: no checkpoint; run benchmarks/weights/bench_load.py first or pass --model")
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    procs, ports = [], []
    try:
        for _ in range(2):
            port = free_port()
            ports.append(port)
            argv = [sys.executable, "-m", "kestrel_trio.cli", "--log-level", "WARNING", "serve", "--model",
                    str(args.model), "--port", str(port), "--weights", args.weights]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(proc)
            ready = wait_healthy(port, proc, timeout=300)
            print(f"  server {len(procs)} (pid {proc.pid}, --weights {args.weights}) ready in {ready:.2f} s")
        for port in ports:  # touch every weight page: a mapped page counts only once it is read
            body = json.dumps({"prompt": "warm up", "max_tokens": 2}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                             headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=300) as response:
                response.read()
        print("  after one 2-token completion on each server:")
        rows = [memory(proc.pid) for proc in procs]
        gib = 2**30
        for i, row in enumerate(rows, 1):
            print(f"  server {i}: RSS {row['Rss'] / gib:.2f} GiB, PSS {row['Pss'] / gib:.2f} GiB "
                  f"(file-backed {row.get('Pss_File', 0) / gib:.2f}, anonymous {row.get('Pss_Anon', 0) / gib:.2f}), "
                  f"shared clean {row.get('Shared_Clean', 0) / gib:.2f} GiB")
        weights = sum(f.stat().st_size for f in args.model.glob("*.safetensors"))
        print(f"  combined: RSS {sum(r['Rss'] for r in rows) / gib:.2f} GiB, PSS {sum(r['Pss'] for r in rows) / gib:.2f} "
              f"GiB; checkpoint files {weights / gib:.2f} GiB")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
