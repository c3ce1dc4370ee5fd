"""A user's mistakes end ``kestrel-trio`` with one line, ``kestrel-trio: error: ...``, and the right exit code.

Exit 2: a usage or model-folder error; exit 1: a runtime failure such as a
port in use. A traceback only with ``--log-level DEBUG``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest
from cli_kit import FIXTURE, run_cli

if sys.version_info < (3, 11):  # trio depends on the backport there
    from exceptiongroup import ExceptionGroup


def _one_error_line(stderr: str) -> str:
    """The stderr of a failed run: exactly one line, the error."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("kestrel-trio: error: "), stderr
    return lines[0]


def _broken_folders(root: Path) -> dict[str, tuple[Path, str]]:
    """Model folders a user gets wrong, and what the error must name."""
    no_config = root / "no-config"
    no_config.mkdir()
    broken_json = root / "broken-json"
    broken_json.mkdir()
    (broken_json / "config.json").write_text('{"hidden_size": 64,', encoding="utf-8")
    bad_field = root / "bad-field"
    shutil.copytree(FIXTURE, bad_field)
    config = json.loads((bad_field / "config.json").read_text(encoding="utf-8"))
    config["hidden_size"] = "wide"
    (bad_field / "config.json").write_text(json.dumps(config), encoding="utf-8")
    a_file = root / "model.safetensors"
    a_file.write_bytes(b"")
    return {
        "missing": (root / "no-such-model", "no such checkpoint folder"),
        "a file": (a_file, "not a folder"),
        "no config.json": (no_config, "no config.json"),
        "config.json not JSON": (broken_json, "cannot read config.json"),
        "a config field of the wrong type": (bad_field, "hidden_size"),
    }


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["generate", "hi"], ["chat"]])
@pytest.mark.parametrize("case", ["missing", "a file", "no config.json", "config.json not JSON",
                                  "a config field of the wrong type"])
def test_a_bad_model_folder_is_one_line_exit_2_before_anything_listens(tmp_path, command, case):
    folder, named = _broken_folders(tmp_path)[case]
    result = run_cli([*command, "--model", str(folder)], timeout=60)
    assert result.returncode == 2, result.stderr
    line = _one_error_line(result.stderr)  # so no "listening" and no "loading weights" came first
    assert str(folder) in line and named in line


@pytest.mark.parametrize("model", [["--model", str(FIXTURE)], []])
def test_a_context_cap_beyond_the_models_config_is_one_line_exit_2_before_anything_listens(model):
    # The config alone answers it: no port is bound, no weights load, nothing compiles first.
    result = run_cli(["serve", "--port", "0", *model, "--max-model-len", "100000"], timeout=60)
    assert result.returncode == 2, result.stderr
    line = _one_error_line(result.stderr)  # no "listening on", no "loading weights" before it
    assert "max_model_len 100000 exceeds the model's context length of " in line


def test_a_port_in_use_is_one_line_exit_1():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(["serve", "--port", str(port)], timeout=60)
    assert result.returncode == 1, result.stderr
    line = _one_error_line(result.stderr)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "in use" in line


def test_a_model_that_fails_to_load_after_the_socket_is_bound_ends_with_one_line(tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    shutil.copy(FIXTURE / "config.json", folder / "config.json")  # a good config.json, no weights
    result = run_cli(["serve", "--port", "0", "--model", str(folder)], timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert "listening on" in lines[0]  # it got as far as binding
    assert lines[-1].startswith(f"kestrel-trio: error: {folder}: no model.safetensors")
    assert "Traceback" not in result.stderr and "ExceptionGroup" not in result.stderr
    assert len(lines) <= 3, result.stderr  # listening, the weights=auto choice at most, the error


def test_debug_log_level_adds_the_traceback_before_the_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(["serve", "--port", str(port), "--log-level", "DEBUG"], timeout=60)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "Address already in use" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"kestrel-trio: error: cannot listen on 127.0.0.1:{port}")


def _console_script() -> Path:
    """The ``kestrel-trio`` script that installing the package put beside this Python."""
    script = Path(sys.executable).parent / ("kestrel-trio.exe" if os.name == "nt" else "kestrel-trio")
    assert script.is_file(), f"no {script}: install the package first (the README's test command does)"
    return script


def test_the_installed_console_script_reports_a_missing_model_folder_in_one_line(tmp_path):
    missing = tmp_path / "no-such-model"
    result = run_cli(["serve", "--port", "0", "--model", str(missing)], command=[str(_console_script())], timeout=60)
    assert result.returncode == 2, result.stderr
    assert _one_error_line(result.stderr) == f"kestrel-trio: error: {missing}: no such checkpoint folder or GGUF file"


def test_serve_takes_its_port_from_kestrel_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(["serve"], timeout=60, env={**os.environ, "KESTREL_PORT": str(port)})
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in _one_error_line(result.stderr)


def test_report_names_the_error_inside_nested_exception_groups(capsys):
    from kestrel_trio.cli.errors import report
    from kestrel_trio.errors import ModelLoadError

    wrapped = ExceptionGroup("outer", [ExceptionGroup("inner", [ModelLoadError("x/config.json: bad")])])
    assert report(wrapped, show_traceback=False) == 2
    assert capsys.readouterr().err == "kestrel-trio: error: x/config.json: bad\n"


def test_report_counts_further_errors_and_points_to_debug_for_a_bug(capsys):
    from kestrel_trio.cli.errors import report

    assert report(ExceptionGroup("g", [ValueError("one"), OSError(98, "two")]), show_traceback=False) == 1
    assert capsys.readouterr().err == ("kestrel-trio: error: ValueError: one "
                                       "(and 1 more error; --log-level DEBUG shows them)\n")
    assert report(RuntimeError("boom"), show_traceback=False) == 1
    assert capsys.readouterr().err == ("kestrel-trio: error: RuntimeError: boom "
                                       "(--log-level DEBUG shows the traceback)\n")
    assert report(KeyboardInterrupt(), show_traceback=False) == 130


def test_bf16_prefill_runs_where_the_cpu_has_amx_and_is_refused_in_one_line_elsewhere():
    from kestrel_trio import _kernels

    reason = _kernels.enable_tiles()
    result = run_cli(["generate", "--model", str(FIXTURE), "--prefill-precision", "bf16", "--max-tokens", "2",
                      "--temperature", "0", "hello " * 40], timeout=120)
    if reason is None:  # this machine has AMX: the prompt's 40+ rows go through bf16 tiles
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()
    else:
        assert result.returncode == 2, result.stderr
        assert _one_error_line(result.stderr) == f"kestrel-trio: error: bf16 prefill needs AMX tiles: {reason}"
