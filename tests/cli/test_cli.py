"""The kestrel-trio command, run as a new user would: a subprocess with no model folder."""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
from cli_kit import FIXTURE, run_cli as _run, start_serve, stop


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


def test_generate_on_a_checkpoint_folder_logs_loading_progress_off_a_terminal():
    result = _run(["generate", "hi", "--model", str(FIXTURE), "--max-tokens", "5", "--temperature", "0", "--no-think"])
    assert result.returncode == 0, result.stderr
    assert "INFO kestrel_trio.load: loading weights: 100% (" in result.stderr
    assert "\r" not in result.stderr  # a bar redrawn in place is for terminals only


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


def test_serve_answers_health_applies_its_flags_and_exits_zero_on_sigterm():
    flags = ["--max-body-bytes", "100", "--max-header-bytes", "2048", "--prefill-chunk", "8", "--linger-timeout", "0.5"]
    process, url, _ = start_serve("--grace", "1", *flags)
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
        stop(process)


def test_serve_cors_origin_and_no_webui():
    process, url, _ = start_serve("--grace", "0", "--no-webui", "--cors-origin", "HTTP://127.0.0.1:3000/",
                                  "--cors-origin", "https://b.test")
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
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        stop(process)


def test_signals_that_keep_coming_through_shutdown_still_exit_zero():
    process, url, _ = start_serve("--grace", "1")
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
        stop(process)


def _chat_replies(out: str) -> list[str]:
    """What the chat wrote after each prompt."""
    return [reply.strip() for reply in out.split(">>> ")[1:]]


def test_chat_answers_help_and_unknown_commands_itself():
    result = _run(["chat", "--max-tokens", "4", "--temperature", "0"], stdin="/help\n/frobnicate now\n/exit\n")
    assert result.returncode == 0, result.stderr
    help_text, unknown, _exit = _chat_replies(result.stdout)
    for command in ("/help", "/reset", "/exit"):
        assert command in help_text
    assert unknown == ("unknown command '/frobnicate': /help lists the commands "
                       "(// sends a message that begins with /)")


def test_chat_sends_a_double_slash_message_to_the_model():
    # "//help" goes to the model as the message "/help": what comes back is the model's text, not the local help.
    result = _run(["chat", "--max-tokens", "4", "--temperature", "0"], stdin="//help\n")
    assert result.returncode == 0, result.stderr
    reply = _chat_replies(result.stdout)[0]
    assert reply and "commands:" not in reply and "unknown command" not in reply
