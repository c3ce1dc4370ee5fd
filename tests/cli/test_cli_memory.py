"""kestrel-trio serve's memory flags (--max-model-len, --kv-cache-mb, --kv-dtype), run as a user would."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request

import pytest

from cli_kit import CLI, start_serve, stop


def test_a_max_model_len_beyond_the_models_context_is_a_one_line_error():
    result = subprocess.run(CLI + ["serve", "--port", "0", "--max-model-len", "9000"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["kestrel-trio: error: max_model_len 9000 exceeds the model's context length of 8192 tokens "
                      "(max_position_embeddings of kestrel-demo-random)"], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--kv-cache-mb", "0", "must be >= 1"), ("--max-model-len", "0", "must be >= 1"),
    ("--kv-dtype", "int8", "invalid choice: 'int8'"),
])
def test_a_bad_memory_flag_names_itself(flag, value, message):
    result = subprocess.run(CLI + ["serve", flag, value], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"argument {flag}: {message}" in result.stderr and "Traceback" not in result.stderr


def test_the_kv_budget_is_printed_at_start_and_shown_on_health():
    process, url, lines = start_serve("--kv-cache-mb", "3", "--kv-dtype", "bf16", "--max-model-len", "1024")
    try:
        budget = [line for line in lines if "KV cache budget" in line and line.startswith("kestrel-trio:")]
        # The demo model: 2 layers x 2 kv heads x 16 x K and V x 2 bytes = 256 bytes a token in bf16.
        assert budget and "3.0 MiB = 12288 tokens" in budget[0] and "context cap 1024 tokens" in budget[0]
        with urllib.request.urlopen(url + "/health", timeout=10) as response:
            health = json.load(response)
        assert health["max_model_len"] == 1024
        assert health["kv_cache"]["budget_bytes"] == 3 * 2**20 and health["kv_cache"]["dtype"] == "bf16"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        stop(process)
