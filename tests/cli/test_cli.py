"""The kestrel-trio command, run as a new user would: a subprocess with no model folder."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"
CLI = [sys.executable, "-m", "kestrel_trio.cli"]


def _run(args: list[str], stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + args, input=stdin, capture_output=True, text=True, timeout=timeout,
                          encoding="utf-8")


def test_generate_with_the_builtin_model_prints_text():
    result = _run(["generate", "你好", "--max-tokens", "8", "--seed", "1"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "demo model" in result.stderr and "meaningless" in result.stderr
    assert "[finish_reason: length]" in result.stderr
    assert "100%" in result.stderr  # the progress bar finished


def test_generate_is_reproducible_with_a_seed():
    first = _run(["generate", "hello", "--max-tokens", "6", "--seed", "7"])
    second = _run(["generate", "hello", "--max-tokens", "6", "--seed", "7"])
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout


def test_generate_on_a_checkpoint_folder_shows_loading_progress():
    result = _run(["--log-level", "WARNING", "generate", "hi", "--model", str(FIXTURE), "--max-tokens", "5",
                   "--temperature", "0", "--no-think"])
    assert result.returncode == 0, result.stderr
    assert "loading weights" in result.stderr and "100%" in result.stderr


def test_bf16_weights_and_one_blas_thread_give_the_same_greedy_text():
    common = ["--log-level", "WARNING", "generate", "hi", "--model", str(FIXTURE), "--max-tokens", "6",
              "--temperature", "0", "--no-think"]
    fp32 = _run(common + ["--weights", "fp32"])
    bf16 = _run(common + ["--weights", "bf16", "--blas-threads", "1"])
    assert fp32.returncode == bf16.returncode == 0, bf16.stderr
    assert fp32.stdout == bf16.stdout and fp32.stdout.strip()


def test_a_bad_model_folder_is_a_clear_cli_error(tmp_path):
    result = _run(["generate", "hi", "--model", str(tmp_path)])
    assert result.returncode == 2
    assert "kestrel-trio: error:" in result.stderr and "config.json" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--max-batch", "0", "must be >= 1"), ("--prefix-cache-mb", "-1", "must be >= 0"),
    ("--header-timeout", "soon", "'soon' is not a number"), ("--port", "70000", "a TCP port is 0 to 65535"),
    ("--linger-timeout", "-1", "must be >= 0"),
    ("--cors-origin", "http://a.test/chat", "'http://a.test/chat' is not an origin"),
])
def test_a_bad_serve_flag_names_itself_without_a_traceback(flag, value, message):
    result = _run(["serve", flag, value], timeout=60)
    assert result.returncode == 2
    assert f"argument {flag}: {message}" in result.stderr and "Traceback" not in result.stderr


def test_chat_keeps_history_resets_and_exits_on_eof():
    result = _run(["chat", "--max-tokens", "4", "--temperature", "0"], stdin="hello\n/reset\nhello\n")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count(">>> ") == 4  # three inputs, then the prompt that meets end of input
    assert "[history cleared]" in out
    answers = [line for line in out.split(">>> ")[1:] if line.strip() and "history" not in line]
    # After /reset the same first message gets the same greedy answer: the history really was cleared.
    assert answers[0].strip() == answers[1].strip()


def _serve(*flags: str) -> tuple[subprocess.Popen, str]:
    """A real `kestrel-trio serve` on port 0 and its base URL, once it says where it listens."""
    process = subprocess.Popen(CLI + ["serve", "--port", "0", *flags], stderr=subprocess.PIPE, text=True)
    url = None
    deadline = time.monotonic() + 60
    while url is None and time.monotonic() < deadline and process.poll() is None:
        line = process.stderr.readline()
        match = re.search(r"serving \S+ at (http://\S+)/v1", line)
        url = match.group(1) if match else None
    if url is None:
        process.kill()
        process.wait()
        pytest.fail("the server never said where it listens")
    return process, url


def test_serve_answers_health_applies_its_flags_and_exits_zero_on_sigterm():
    flags = ["--max-body-bytes", "100", "--max-header-bytes", "2048", "--prefill-chunk", "8", "--linger-timeout", "0.5"]
    process, url = _serve("--grace", "1", *flags)
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as response:
            assert response.status == 200
        too_big = urllib.request.Request(url + "/v1/completions", data=b"{" + b" " * 200 + b"}",
                                         headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(too_big, timeout=10)
        assert refused.value.code == 413
        refused.value.close()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        assert code == 0, process.stderr.read()[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


def test_serve_cors_origin_and_no_webui():
    process, url = _serve("--grace", "0", "--no-webui", "--cors-origin", "HTTP://127.0.0.1:3000/", "--cors-origin",
                          "https://b.test")
    try:
        with pytest.raises(urllib.error.HTTPError) as no_page:
            urllib.request.urlopen(url + "/", timeout=10)
        assert no_page.value.code == 404
        no_page.value.close()
        preflight = urllib.request.Request(url + "/v1/chat/completions", method="OPTIONS", headers={
            "origin": "http://127.0.0.1:3000", "access-control-request-method": "POST"})
        with urllib.request.urlopen(preflight, timeout=10) as answer:
            assert answer.status == 204
            assert answer.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"
        with urllib.request.urlopen(urllib.request.Request(url + "/health", headers={"origin": "https://b.test"}),
                                    timeout=10) as answer:
            assert answer.headers["access-control-allow-origin"] == "https://b.test"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stderr.close()


def test_signals_that_keep_coming_through_shutdown_still_exit_zero():
    process, url = _serve("--grace", "1")
    lines: list[str] = []
    drain = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)  # a full pipe would block it
    drain.start()
    try:
        deadline = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < deadline:
            process.send_signal(signal.SIGTERM)  # the first starts the shutdown; the rest land all through it
            time.sleep(0.002)
        code = process.wait(timeout=5)
        drain.join(timeout=5)
        assert code == 0, "".join(lines)[-2000:]
        assert any("graceful shutdown" in line for line in lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
