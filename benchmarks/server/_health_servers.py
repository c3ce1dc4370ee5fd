"""bench_health.py's server processes: kestrel-trio and the minimal hypercorn app, each a subprocess of ours on
127.0.0.1, with its CPU time read from /proc and every descendant ended by PID; and the heavy model part 2 serves.

Timeouts are seconds.
"""

from __future__ import annotations

import gzip
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST = "127.0.0.1"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
HEAVY_MODEL = Path.home() / ".cache" / "kestrel-trio-bench" / "qwen3-0.6b-shapes-bf16"
_READY_LINE = re.compile(r"serving (\S+) at http://127\.0\.0\.1:(\d+)/v1")
_TICK = os.sysconf("SC_CLK_TCK")


def pid_tree(root: int) -> list[int]:
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


def cpu_seconds(pids: list[int]) -> float:
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
        tree = pid_tree(self.proc.pid)
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
