"""Running the real ``kestrel-trio`` command in a subprocess, as a user would."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"
CLI = [sys.executable, "-m", "kestrel_trio.cli"]
READY = re.compile(r"serving \S+ at (http://\S+)/v1")


def run_cli(args: list[str], stdin: str = "", timeout: float = 120, command: list[str] = CLI,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``kestrel-trio ARGS`` to its end; stdout and stderr as text."""
    return subprocess.run(command + args, input=stdin, capture_output=True, text=True, timeout=timeout,
                          encoding="utf-8", env=env)


def start_serve(*flags: str, deadline_s: float = 60,
                env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, list[str]]:
    """A real ``kestrel-trio serve --port 0``, once it says where it listens (``env``: its environment).

    Returns:
        (the process, its base URL http://127.0.0.1:PORT, the stderr lines read so far).
    """
    process = subprocess.Popen(CLI + ["serve", "--port", "0", *flags], stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    url = None
    deadline = time.monotonic() + deadline_s
    while url is None and time.monotonic() < deadline and process.poll() is None:
        line = process.stderr.readline()
        lines.append(line)
        match = READY.search(line)
        url = match.group(1) if match else None
    if url is None:
        process.kill()
        process.wait()
        pytest.fail("the server never said where it listens:\n" + "".join(lines) + process.stderr.read())
    return process, url, lines


def stop(process: subprocess.Popen) -> None:
    """Kill ``process`` (started by this test) if it still runs, and reap it."""
    if process.poll() is None:
        process.kill()
    process.wait()
    if process.stderr is not None:
        process.stderr.close()
