"""The examples run against a server on any port: ``--port`` or ``$KESTREL_PORT``, never a fixed 8000."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cli_kit import start_serve, stop

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUDGET = 90.0  # s, absolute per example run


@pytest.fixture(scope="module")
def demo_server():
    """A real ``kestrel-trio serve`` of the demo model on a free port: its base URL (http://127.0.0.1:PORT)."""
    process, url, _ = start_serve("--log-level", "WARNING")
    try:
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        finally:
            stop(process)


def _port(url: str) -> str:
    return url.rsplit(":", 1)[1]


def _agent(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # The demo model calls no tool: one turn of at most 8 tokens, then the loop prints the text.
    return subprocess.run([sys.executable, str(EXAMPLES / "agent_loop.py"), "--question", "hi", "--max-tokens", "8",
                           *args],
                          capture_output=True, text=True, timeout=BUDGET, env=env)


def test_the_agent_loop_takes_the_port_as_a_flag(demo_server):
    result = _agent(["--port", _port(demo_server)])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip()


def test_the_agent_loop_takes_the_port_from_the_environment(demo_server):
    result = _agent([], env={**os.environ, "KESTREL_PORT": _port(demo_server)})
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_embedded_server_binds_the_port_it_is_given():
    process = subprocess.Popen([sys.executable, str(EXAMPLES / "embedded_server.py"), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + BUDGET
        url = None
        while url is None and time.monotonic() < deadline and process.poll() is None:
            match = re.search(r"OpenAI API at (http://127\.0\.0\.1:(\d+))/v1", process.stdout.readline())
            url = match.group(1) if match else None
        assert url is not None, process.stderr.read() if process.poll() is not None else "no URL in time"
        assert _port(url) != "8000"
        with urllib.request.urlopen(url + "/health", timeout=10) as response:
            assert response.status == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdout.close()
        process.stderr.close()
