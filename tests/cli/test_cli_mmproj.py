"""``--mmproj``: the vision tower of a Qwen3-VL GGUF ``--model``, from the command line."""

from __future__ import annotations

import importlib.util
import json
import urllib.request
from pathlib import Path

from cli_kit import run_cli, start_serve, stop

# Video files are listed where the server can decode them (PyAV, the video extra).
VIDEO = ["video"] if importlib.util.find_spec("av") is not None else []

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LM = FIXTURES / "qwen3_vl_gguf" / "lm-f16.gguf"
MMPROJ = FIXTURES / "qwen3_vl_gguf" / "mmproj-f16.gguf"


def _error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kestrel-trio: error: "), stderr
    return lines[0]


def test_mmproj_without_a_model_is_one_line_exit_2():
    result = run_cli(["serve", "--port", "0", "--mmproj", str(MMPROJ)], timeout=60)
    assert result.returncode == 2, result.stderr
    assert "--mmproj goes with --model" in _error_line(result.stderr)


def test_an_mmproj_that_does_not_fit_is_one_line_exit_2_before_anything_listens():
    text = FIXTURES / "gguf" / "qwen3_quant" / "qwen3_quant.gguf"
    result = run_cli(["serve", "--port", "0", "--model", str(text), "--mmproj", str(MMPROJ)], timeout=60)
    assert result.returncode == 2, result.stderr
    line = _error_line(result.stderr)
    assert "qwen3_quant.gguf: an mmproj file needs a Qwen3-VL language model" in line


def test_serve_with_mmproj_says_it_takes_images():
    process, url, _ = start_serve("--grace", "0", "--model", str(LM), "--mmproj", str(MMPROJ))
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as response:
            listed = json.loads(response.read())
    finally:
        stop(process)
    assert listed["data"][0]["input_modalities"] == ["text", "image", *VIDEO]
