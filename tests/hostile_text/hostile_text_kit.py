"""Test support for the hostile-input suite: running one case in a child process under an address-space limit.

A case that grows memory without bound, or that aborts in Rust, must not take the test runner with it; and a
bounded peak is checked against a same-run baseline (the child's own size before the case), never an absolute
figure: the child sets RLIMIT_AS to its current size plus ``room`` bytes, then runs the case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")

_PRELUDE = """
import json, resource, sys

def vm_size():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

def limit(room):
    size = vm_size() + room
    resource.setrlimit(resource.RLIMIT_AS, (size, size))

def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)
"""


def run_child(code: str, *, timeout: float = 300) -> tuple[int, dict | None, str]:
    """Run ``code`` (after the prelude: ``limit(room)``, ``report(**fields)``) in a fresh interpreter.

    Returns:
        (exit code, the fields of its ``report`` line or None, its stderr).
    """
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    result = None
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    return done.returncode, result, done.stderr[-3000:]


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"


def copy_fixture(folder: Path, *, tokenizer: dict | None = None, chat_template: str | None = None) -> Path:
    """The tiny fixture checkpoint copied to ``folder``, with a hostile tokenizer.json and/or chat template."""
    import shutil

    shutil.copytree(FIXTURE, folder)
    if tokenizer is not None:
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    if chat_template is not None:
        (folder / "chat_template.jinja").write_text(chat_template)
    return folder


def backtracking_tokenizer() -> dict:
    """The fixture's tokenizer.json with a pre-tokenizer regex that backtracks: Oniguruma's retry limit makes
    ``tokenizers`` panic (pyo3's PanicException, a BaseException) on a long run of ``a`` not followed by the end."""
    tokenizer = json.loads((FIXTURE / "tokenizer.json").read_text())
    tokenizer["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": "(a+)+$"}
    return tokenizer
