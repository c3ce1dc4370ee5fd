"""The CI skip rule of tests/conftest.py, run for real: a pytest in a fresh process over a small test file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SUBPROCESS_TIMEOUT_S = 120

SAMPLE = '''
import pytest

def test_a_missing_tool():
    pytest.skip("no haproxy on PATH")

@pytest.mark.host_cpu
def test_a_missing_instruction_set():
    pytest.skip("needs AVX-512F")

@pytest.mark.host_cpu
def test_a_host_cpu_test_that_runs():
    assert True
'''


def run_sample(tmp_path: Path, ci: str) -> str:
    """pytest's summary lines for SAMPLE, with tests/conftest.py loaded as a plugin and CI set to ``ci``."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    path = [str(TESTS)] + [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    env = {**os.environ, "CI": ci, "PYTHONPATH": os.pathsep.join(path)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "conftest", "-c", os.devnull, "--rootdir", str(tmp_path),
         "-o", "markers=host_cpu: the marker under test", "-p", "no:cacheprovider", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=tmp_path)
    return result.stdout


def test_under_ci_a_skip_fails_unless_the_host_cpu_lacks_an_instruction_set(tmp_path):
    out = run_sample(tmp_path, "true")
    assert "FAILED test_sample.py::test_a_missing_tool - skipped under CI=true" in out
    assert "SKIPPED [1] test_sample.py:9: needs AVX-512F" in out
    assert "PASSED test_sample.py::test_a_host_cpu_test_that_runs" in out
    assert "1 failed, 1 passed, 1 skipped" in out


@pytest.mark.parametrize("ci", ["", "false"])
def test_outside_ci_every_skip_is_a_skip(tmp_path, ci):
    out = run_sample(tmp_path, ci)
    assert "1 passed, 2 skipped" in out, out
