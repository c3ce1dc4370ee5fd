"""Test support for the deployment suite: replica and balancer processes, HAProxy's stats, client calls.

Everything here drives real processes on 127.0.0.1, so waits are polls against a
deadline (an external process has no mock clock). Every process is started with
:class:`Child` and ended by its own PID.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, TypeVar

import attrs
import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
HOST = "127.0.0.1"
API_KEY = "deploy-suite-key"
MODEL_ID = "kestrel-demo-random"
POLL_SECONDS = 0.05
REPLICA_HEADER = "x-kestrel-replica"

T = TypeVar("T")


def require_tool(name: str, package: str | None = None) -> str:
    """The path of an installed program, or skip the test saying which Debian package has it."""
    # Debian puts haproxy and nginx in /usr/sbin, which a non-root PATH often lacks.
    path = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if path is None:
        pytest.skip(f"{name} is not installed (Debian: apt-get install {package or name})")
    return path


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now (a static balancer config needs them up front)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((HOST, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_until(probe: Callable[[], T], timeout: float, what: str) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_SECONDS)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """Status and body of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()
    except OSError:
        return 0, b""


class Child:
    """A process this test started, its output going to a log file; ended only by its PID."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None,
                 stop_signal: int = signal.SIGKILL) -> None:
        self.name = name
        self._stop_signal = stop_signal
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                      env={**os.environ, **(env or {})})

    def terminate(self) -> None:
        """SIGTERM: a graceful shutdown."""
        self.popen.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        """The exit code, waiting at most ``timeout`` seconds."""
        return self.popen.wait(timeout=timeout)

    def log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        """End the process if it still runs (its stop signal, then SIGKILL after 5 s), and close its log."""
        try:
            if self.popen.poll() is None:
                self.popen.send_signal(self._stop_signal)
                try:
                    self.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait(timeout=10)
        finally:
            self._log.close()


def start_replica(port: int, log_path: Path, *, drain_delay: float, grace: float) -> Child:
    """``kestrel-trio serve`` on the built-in demo model, requiring :data:`API_KEY`."""
    argv = [sys.executable, "-m", "kestrel_trio.cli", "serve", "--host", HOST, "--port", str(port),
            "--drain-delay", str(drain_delay), "--grace", str(grace)]
    return Child(f"replica:{port}", argv, log_path, env={"KESTREL_API_KEY": API_KEY})


def health(port: int) -> tuple[int, dict]:
    """A replica's /health, asked directly: status code (0 if closed) and body."""
    status, body = http_get(f"http://{HOST}:{port}/health")
    return status, (json.loads(body) if body else {})


def wait_healthy(child: Child, port: int, timeout: float = 60.0) -> None:
    def probe() -> bool:
        if child.popen.poll() is not None:
            raise AssertionError(f"{child.name} exited with {child.popen.returncode}:\n{child.log_tail()}")
        return health(port)[0] == 200

    wait_until(probe, timeout, f"{child.name} /health 200")


def haproxy_server_states(stats_port: int, backend: str = "kestrel_replicas") -> dict[str, str]:
    """Server name -> status ("UP", "DOWN", "UP 1/2", ...) from HAProxy's CSV stats page."""
    status, body = http_get(f"http://{HOST}:{stats_port}/;csv")
    if status != 200:
        return {}
    rows = csv.DictReader(io.StringIO(body.decode().lstrip("# ")))
    return {row["svname"]: row["status"] for row in rows
            if row["pxname"] == backend and row["svname"] not in ("FRONTEND", "BACKEND")}


@attrs.frozen
class Outcome:
    """How one request through the balancer ended.

    Attributes:
        started: ``time.monotonic()`` when it was sent (s).
        ended: ``time.monotonic()`` when it ended (s).
        replica: the X-Kestrel-Replica header (which replica answered), or None.
        kind: "completed", "error-event" (an SSE error event, then [DONE]) or "failed".
        detail: what went wrong, for "failed" and "error-event".
        chunks: SSE data events received (0 when not streamed).
    """

    started: float
    ended: float
    replica: str | None
    kind: str
    detail: str = ""
    chunks: int = 0


def classify_sse(payloads: list[str]) -> tuple[str, str]:
    """(kind, detail) of a finished stream's ``data`` payloads: completed, error-event or failed."""
    if not payloads or payloads[-1] != "[DONE]":
        return "failed", f"the stream did not end with [DONE] (last: {payloads[-1:]!r})"
    events = [json.loads(payload) for payload in payloads[:-1]]
    errors = [index for index, event in enumerate(events) if "error" in event]
    if errors:
        if errors != [len(events) - 1]:
            return "failed", f"an error event was not the last before [DONE]: {payloads!r}"
        return "error-event", events[-1]["error"]["message"]
    if not any(choice.get("finish_reason") for event in events for choice in event.get("choices", ())):
        return "failed", "no chunk carried a finish_reason"
    return "completed", ""


def chat_stream(client, max_tokens: int, started_event: threading.Event | None = None) -> Outcome:
    """One streamed chat completion through ``client``; sets ``started_event`` at the first content chunk."""
    started = time.monotonic()
    replica, payloads = None, []
    try:
        with client.chat.completions.with_streaming_response.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "count"}], stream=True, max_tokens=max_tokens,
            temperature=0,
        ) as response:
            replica = response.headers.get(REPLICA_HEADER)
            for line in response.iter_lines():
                if line.startswith("data: "):
                    payloads.append(line[len("data: "):])
                    if len(payloads) == 2 and started_event is not None:
                        started_event.set()  # the role chunk, then the first content chunk
        kind, detail = classify_sse(payloads)
    except Exception as exc:  # any failure at all is what the test counts
        kind, detail = "failed", repr(exc)
    return Outcome(started, time.monotonic(), replica, kind, detail, len(payloads))


def chat_once(client, max_tokens: int) -> Outcome:
    """One non-streamed chat completion through ``client``."""
    started = time.monotonic()
    replica = None
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens, temperature=0,
        )
        replica = raw.headers.get(REPLICA_HEADER)
        finish = raw.parse().choices[0].finish_reason
        kind, detail = ("completed", "") if finish in ("stop", "length") else ("failed", f"finish_reason {finish!r}")
    except Exception as exc:
        kind, detail = "failed", repr(exc)
    return Outcome(started, time.monotonic(), replica, kind, detail)


class LoadLoop:
    """Short requests sent back to back (streamed and not, alternately) until stopped."""

    def __init__(self, make_client: Callable[[], object], pause: float = 0.05) -> None:
        self.outcomes: list[Outcome] = []
        self._make_client = make_client
        self._pause = pause
        self._stop = threading.Event()

    def run(self) -> None:
        with self._make_client() as client:
            streamed = False
            while not self._stop.is_set():
                outcome = chat_stream(client, 6) if streamed else chat_once(client, 4)
                self.outcomes.append(outcome)
                streamed = not streamed
                self._stop.wait(self._pause)

    def stop(self) -> None:
        self._stop.set()


NGINX_VARIABLES = "${KESTREL_LB_LISTEN} ${KESTREL_BOARD1} ${KESTREL_BOARD2}"  # as docs/deployment.md gives them


def render_nginx_site(envsubst: str, env: dict[str, str], out: Path) -> Path:
    """deploy/nginx.conf rendered by ``envsubst`` exactly as docs/deployment.md does it."""
    with open(DEPLOY / "nginx.conf", "rb") as template:
        site = subprocess.run([envsubst, NGINX_VARIABLES], stdin=template, capture_output=True, check=True,
                              env={**os.environ, **env}, timeout=10).stdout
    out.write_bytes(site)
    return out


def nginx_main_config(prefix: Path, site: Path) -> Path:
    """A minimal foreground nginx.conf for a test: everything under ``prefix``, then the site included."""
    temp = "".join(f"    {kind}_temp_path {prefix / kind};\n"
                   for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    # One process (no master/worker pair), so killing its PID can leave no orphaned worker holding the port.
    text = (f"daemon off;\nmaster_process off;\npid {prefix / 'nginx.pid'};\n"
            f"error_log {prefix / 'nginx-error.log'} notice;\nevents {{ worker_connections 256; }}\n"
            f"http {{\n    access_log {prefix / 'nginx-access.log'};\n{temp}    include {site};\n}}\n")
    path = prefix / "nginx-main.conf"
    path.write_text(text)
    return path
