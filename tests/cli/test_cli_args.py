"""``kestrel-trio``'s arguments behave as a user expects: mistakes are named, help is there, defaults are shown."""

from __future__ import annotations

import os
import re

import pytest
from cli_kit import run_cli

import kestrel_trio

COMMANDS = ["serve", "generate", "chat"]
HUB_COMMANDS = ["pull", "list", "rm"]


def test_an_unknown_top_level_flag_is_named():
    result = run_cli(["--frobnicate"], timeout=30)
    assert result.returncode == 2
    assert "kestrel-trio: error: unrecognized arguments: --frobnicate" in result.stderr
    assert "required" not in result.stderr


def test_a_mistyped_serve_flag_shows_the_serve_usage_and_names_the_flag():
    result = run_cli(["serve", "--prot", "18102"], timeout=30)
    assert result.returncode == 2
    usage, error = result.stderr.strip().splitlines()
    assert usage.startswith("usage: kestrel-trio serve ")
    assert error == "kestrel-trio serve: error: unrecognized arguments: --prot 18102 (did you mean --port?)"


def test_an_extra_generate_argument_is_named_under_the_generate_usage():
    result = run_cli(["generate", "hi", "there"], timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: kestrel-trio generate ")
    assert "kestrel-trio generate: error: unrecognized arguments: there" in result.stderr


def test_run_alone_it_prints_the_help_to_stdout_and_exits_0():
    result = run_cli([], timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kestrel-trio ")
    for command in COMMANDS:
        assert command in result.stdout
    assert result.stderr == ""


def test_the_top_level_usage_lists_every_command_and_says_what_it_serves():
    result = run_cli(["--help"], timeout=30)
    assert result.returncode == 0, result.stderr
    usage = result.stdout.splitlines()[0]
    assert usage == "usage: kestrel-trio [-h] [--version] [--log-level LEVEL] {serve,generate,chat,pull,list,rm} ..."
    assert "Qwen and Llama-family models" in " ".join(result.stdout.split())  # SmolLM2, the quick start's, is Llama


@pytest.mark.parametrize(("command", "usage"), [("pull", "[options] NAME"), ("list", "[options]"),
                                                ("rm", "[options] NAME")])
def test_each_hub_command_has_its_own_usage_line_and_a_description(command, usage):
    result = run_cli([command, "--help"], timeout=30)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"usage: kestrel-trio {command} {usage}"  # not the top-level usage with the command after it
    assert lines[1] == "" and lines[2] and not lines[2].startswith(("options:", "positional")), result.stdout


@pytest.mark.parametrize("where", ["before", "after"])
def test_the_hub_commands_take_the_global_flags(tmp_path, where):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_CACHE", None)
    flag = ["--log-level", "DEBUG"]
    result = run_cli([*flag, "list"] if where == "before" else ["list", *flag], timeout=30, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("no models cached")
    version = run_cli(["list", "--version"], timeout=30)
    assert version.stdout.strip() == f"kestrel-trio {kestrel_trio.__version__}"


@pytest.mark.parametrize("where", [["--version"], ["serve", "--version"]])
def test_version_prints_the_package_version(where):
    result = run_cli(where, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"kestrel-trio {kestrel_trio.__version__}"


@pytest.mark.parametrize("command", COMMANDS)
def test_log_level_is_accepted_after_the_subcommand(tmp_path, command):
    # A missing model folder makes each command stop right after parsing, whatever it is.
    result = run_cli([command, *(["hi"] if command == "generate" else []), "--log-level", "debug",
                      "--model", str(tmp_path / "none")], timeout=30)
    assert result.returncode == 2
    assert "no such checkpoint folder" in result.stderr
    assert "Traceback" in result.stderr  # DEBUG took effect: the traceback comes before the line


def test_log_level_before_the_subcommand_still_works_and_a_subcommand_default_does_not_override_it(tmp_path):
    result = run_cli(["--log-level", "DEBUG", "serve", "--model", str(tmp_path / "none")], timeout=30)
    assert result.returncode == 2 and "Traceback" in result.stderr


def _option_entries(help_text: str) -> dict[str, str]:
    """Each option of a --help text -> its whole help entry (the option line and its continuation lines)."""
    entries: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        match = re.match(r"  (-\w, )?(--[\w-]+)", line)
        if match:
            current = match.group(2)
            entries[current] = line
        elif current and line.startswith("      "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize("command", COMMANDS + HUB_COMMANDS)
def test_every_option_shows_its_default_in_help(command):
    result = run_cli([command, "--help"], timeout=30)
    assert result.returncode == 0, result.stderr
    entries = _option_entries(result.stdout)
    assert "--log-level" in entries and ("--model" in entries or command in HUB_COMMANDS)
    missing = [option for option, entry in entries.items()
               if option not in ("--help", "--version") and "default" not in entry]
    assert missing == []


def test_the_timeouts_show_their_defaults():
    entries = _option_entries(run_cli(["serve", "--help"], timeout=30).stdout)
    for option, seconds in (("--header-timeout", 10), ("--body-timeout", 30), ("--keepalive-timeout", 5),
                            ("--write-timeout", 30)):
        assert f"(default {seconds})" in entries[option]


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--max-tokens", "-3", "max_tokens must be >= 1"),
    ("--max-tokens", "0", "max_tokens must be >= 1"),
    ("--temperature", "-1", "temperature must be in [0.0, 2.0]"),
    ("--temperature", "nan", "temperature must be in [0.0, 2.0]"),
    ("--top-p", "0", "top_p must be in (0.0, 1.0]"),
    ("--top-p", "1.5", "top_p must be in (0.0, 1.0]"),
    ("--seed", "1.5", "'1.5' is not an integer"),
])
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_bad_sampling_values_are_refused_by_the_parser_before_the_model_loads(tmp_path, command, flag, value, message):
    # The model folder does not exist: had the value got past the parser, that would be the error.
    args = [command, *(["hi"] if command == "generate" else []), "--model", str(tmp_path / "none"), f"{flag}={value}"]
    result = run_cli(args, timeout=30)
    assert result.returncode == 2
    assert f"kestrel-trio {command}: error: argument {flag}: {message}" in result.stderr
    assert "checkpoint folder" not in result.stderr


def test_serve_reasoning_takes_its_three_modes_and_names_a_wrong_one():
    from kestrel_trio.cli.parser import build_parser

    parser = build_parser()
    assert [parser.parse_args(["serve", *flags]).reasoning for flags in ([], ["--reasoning", "off"],
                                                                          ["--reasoning=on"])] == ["auto", "off", "on"]
    result = run_cli(["serve", "--reasoning", "sometimes"], timeout=30)
    assert result.returncode == 2
    # Python versions quote the choices differently.
    assert "argument --reasoning: invalid choice: 'sometimes' (choose from " in result.stderr
    assert all(mode in result.stderr.splitlines()[-1] for mode in ("auto", "on", "off"))
