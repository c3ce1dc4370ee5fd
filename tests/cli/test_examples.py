"""The examples run against a server on any port (``--port`` or ``$KESTREL_PORT``, never a fixed 8000) and take
any model ``--model`` takes, named models included."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from cli_kit import start_serve, stop
from real_models import smollm2_135m

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


@contextlib.contextmanager
def _embedded_server(*args: str) -> Iterator[subprocess.Popen]:
    """examples/embedded_server.py running with ``args``, ended (killed if it has not stopped) on the way out."""
    process = subprocess.Popen([sys.executable, str(EXAMPLES / "embedded_server.py"), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdout.close()
        process.stderr.close()


def test_the_embedded_server_binds_the_port_it_is_given():
    with _embedded_server("--port", "0") as process:
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


def test_the_engine_example_runs_a_named_model():
    smollm2_135m()  # fetched once into the user's cache, where the example finds it by name
    result = subprocess.run([sys.executable, str(EXAMPLES / "engine_without_http.py"), "smollm2-135m"],
                            capture_output=True, text=True, timeout=BUDGET)
    assert result.returncode == 0, result.stderr[-2000:]
    answers = result.stdout.strip().splitlines()
    assert len(answers) == 3 and all(" -> " in line for line in answers), result.stdout
    assert "4" in next(line for line in answers if line.startswith("'What is 2+2?'"))  # a real model, greedy


@pytest.mark.parametrize("example", [["engine_without_http.py", "smollm2"],
                                     ["embedded_server.py", "--port", "0", "--model", "smollm2"]])
def test_an_example_given_a_wrong_model_name_says_so_in_one_line(example):
    result = subprocess.run([sys.executable, str(EXAMPLES / example[0]), *example[1:]],
                            capture_output=True, text=True, timeout=BUDGET)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"{example[0]}: error: 'smollm2' is not a named model: did you mean smollm2-135m? "
        "(other models: a folder, a .gguf file or a hub repo id, owner/name)"]


def test_the_embedded_server_serves_a_named_model_under_its_name():
    smollm2_135m()
    with _embedded_server("--port", "0", "--model", "smollm2-135m") as process:
        deadline = time.monotonic() + BUDGET
        line = ""
        while "OpenAI API at" not in line and time.monotonic() < deadline and process.poll() is None:
            line = process.stdout.readline()
        assert "OpenAI API at" in line, process.stderr.read() if process.poll() is not None else "no URL in time"
        assert line.rstrip().endswith("(model smollm2-135m)")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
