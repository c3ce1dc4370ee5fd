"""``serve``'s speculative decoding flags: refused in one line before anything loads or listens; a server that uses them."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from cli_kit import FIXTURE, run_cli, start_serve, stop

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(("flags", "message"), [
    (["--speculative", "draft"], "--speculative draft needs --draft-model MODEL"),
    (["--speculative", "ngram", "--draft-model", str(FIXTURE)], "--draft-model drafts for --speculative draft, not "
                                                                  "ngram: choose one"),
    (["--speculative-tokens", "4"], "--speculative-tokens needs --speculative ngram or --draft-model"),
    (["--speculative", "ngram", "--speculative-tokens", "0"], "argument --speculative-tokens: must be >= 1, got 0"),
    (["--speculative", "ngram", "--speculative-tokens", "32"], "argument --speculative-tokens: must be <= 31, got 32"),
    (["--speculative", "medusa"], "argument --speculative: invalid choice: 'medusa'"),
])
def test_inconsistent_flags_are_a_usage_error_before_the_model_loads(tmp_path, flags, message):
    # The model folder does not exist: had the flags got past the parser, that would be the error.
    result = run_cli(["serve", "--model", str(tmp_path / "none"), *flags], timeout=30)
    assert result.returncode == 2
    assert f"kestrel-trio serve: error: {message}" in result.stderr
    assert "checkpoint folder" not in result.stderr


@pytest.mark.parametrize(("draft", "message"), [
    (FIXTURES / "qwen3_fp32", "qwen3_fp32 has no tokenizer"),
    (FIXTURES / "qwen3_vl", "draft model qwen3_vl: its tokenizer has"),
    (Path("no-such-folder"), "no-such-folder"),
])
def test_a_draft_model_that_cannot_draft_is_one_line_exit_2_before_anything_listens(draft, message):
    result = run_cli(["serve", "--model", str(FIXTURE), "--port", "0", "--draft-model", str(draft)], timeout=60)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("kestrel-trio: error: ") and message in errors[0], result.stderr
    assert "listening" not in result.stderr


def test_serve_with_ngram_speculation_reports_it_and_serves():
    process, url, lines = start_serve("--model", str(FIXTURE), "--speculative", "ngram", "--speculative-tokens", "5")
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as response:
            health = json.loads(response.read())
        assert health["speculative"] == {"mode": "ngram", "tokens": 5, "draft_model": None}
        assert any("speculative decoding: ngram, 5 tokens a draft" in line for line in lines)
        body = json.dumps({"model": health.get("model", "qwen3_bf16_tied"), "prompt": "a b c a b c a b c",
                           "max_tokens": 12, "temperature": 0}).encode()
        request = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            completion = json.loads(response.read())
        assert completion["usage"]["completion_tokens"] >= 1
    finally:
        stop(process)


def test_the_flags_are_in_serves_help():
    result = run_cli(["serve", "--help"], timeout=30)
    assert "--speculative {off,ngram,draft}" in result.stdout
    assert "--draft-model MODEL" in result.stdout and "--speculative-tokens K" in result.stdout
