"""Sampling from the command line: serve's default flags, chat's /set, a named model's publisher's defaults."""

from __future__ import annotations

import json
import urllib.request

import pytest
from cli_kit import run_cli, start_serve, stop
from real_models import smollm2_135m


def _card(url: str) -> dict:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
        return json.load(response)["data"][0]


def test_serve_sampling_flags_become_the_defaults_the_card_reports():
    process, url, _ = start_serve("--grace", "0", "--temperature", "0.3", "--top-k", "40", "--min-p", "0.05",
                                  "--repeat-penalty", "1.1", "--repetition-guard", "64:4")
    try:
        card = _card(url)
    finally:
        stop(process)
    assert card["sampling_defaults"] == {"temperature": 0.3, "top_p": 1.0, "top_k": 40, "min_p": 0.05,
                                         "repetition_penalty": 1.1, "max_tokens": 256,  # the demo model's cap
                                         "repetition_guard": {"window": 64, "repeats": 4}}


def test_serve_default_max_tokens_0_is_openais_up_to_the_context():
    process, url, _ = start_serve("--grace", "0", "--default-max-tokens", "0")
    try:
        card = _card(url)
    finally:
        stop(process)
    assert card["sampling_defaults"]["max_tokens"] is None


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--top-p", "0", "top_p must be in (0.0, 1.0], got 0.0"),
    ("--min-p", "2", "min_p must be in [0.0, 1.0], got 2.0"),
    ("--repeat-penalty", "0", "repetition_penalty must be from 0.01 to 100, got 0.0"),
    ("--repetition-guard", "64:1", "repetition_guard.repeats must be from 2 to the window (64), got 1"),
    ("--default-max-tokens", "-1", "must be >= 0, got -1"),
])
def test_a_bad_sampling_flag_is_one_line_naming_it(flag: str, value: str, message: str):
    result = run_cli(["serve", flag, value], timeout=60)
    assert result.returncode == 2
    assert f"argument {flag}" in result.stderr and message in result.stderr and "Traceback" not in result.stderr


def test_chat_set_changes_sampling_and_help_lists_it():
    stdin = "/help\n/set temperature 0\n/set top-k 40\n/set repetition_guard 64:4\n/set temperature 3\n" \
            "/set frobs 1\n/set\n/set temperature default\n/set repetition_guard off\n"
    result = run_cli(["chat", "--max-tokens", "4"], stdin=stdin)
    assert result.returncode == 0, result.stderr
    help_text, temperature, top_k, guard, too_hot, unknown, listing, back, off, _end = \
        [reply.strip() for reply in result.stdout.split(">>> ")[1:]]
    assert "/set" in help_text and "temperature" in help_text and "repetition_guard" in help_text
    assert (temperature, top_k, guard) == ("[temperature 0.0]", "[top_k 40]", "[repetition_guard 64:4]")
    assert too_hot == "temperature: temperature must be in [0.0, 2.0], got 3.0"
    assert unknown.startswith("usage: /set NAME VALUE, NAME one of temperature, top_p, top_k")
    assert "temperature 0.0\n" in listing + "\n" and "top_p 1.0 (default)" in listing
    assert back == "[temperature 1.0 (default)]" and off == "[repetition_guard off (default)]"


def test_chat_on_smollm2_samples_at_its_named_entrys_defaults():
    model = str(smollm2_135m())
    result = run_cli(["chat", "--model", model, "--seed", "0", "--max-tokens", "40"],
                     stdin="/set\nWhat is the capital of France?\n", timeout=600)
    assert result.returncode == 0, result.stderr
    listing, answer, _end = [reply.strip() for reply in result.stdout.split(">>> ")[1:]]
    assert "temperature 0.0 (default)" in listing and "repetition_penalty 1.1 (default)" in listing  # the entry's
    assert "Paris" in answer
