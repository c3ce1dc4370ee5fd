"""A GGUF repo's vision projector (``mmproj``) comes with the model, as llama.cpp's ``-hf`` fetches it."""

from __future__ import annotations

import argparse
import importlib.util
import io
from pathlib import Path

import pytest
from hub_server import FakeHub

from kestrel_trio.cli.dispatch import _take_repo_mmproj
from kestrel_trio.hub import HubSettings, resolve_model
from kestrel_trio.hub.gguf_files import select_mmproj

# Video files are listed where the server can decode them (PyAV, the video extra).
VIDEO = ["video"] if importlib.util.find_spec("av") is not None else []

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REPO = "Tiny/Tiny-VL-GGUF"
FILES = {
    "Tiny-VL-Q4_K_M.gguf": b"GGUF q4km", "Tiny-VL-Q8_0.gguf": b"GGUF q8",
    "mmproj-Tiny-VL-F16.gguf": b"GGUF projector f16", "mmproj-Tiny-VL-Q8_0.gguf": b"GGUF projector q8",
}


@pytest.mark.parametrize(("paths", "tag", "chosen"), [
    (list(FILES), "Q8_0", "mmproj-Tiny-VL-Q8_0.gguf"),  # the model's own tag first
    (list(FILES), "q4_k_m", "mmproj-Tiny-VL-F16.gguf"),  # else F16
    (["m-Q4_K_M.gguf", "mmproj-m-BF16.gguf", "mmproj-m-Q8_0.gguf"], "Q4_K_M", "mmproj-m-BF16.gguf"),
    (["m-Q4_K_M.gguf", "mmproj-m-Q8_0.gguf", "mmproj-m-F32.gguf"], None, "mmproj-m-F32.gguf"),
    (["m-Q4_K_M.gguf", "mmproj-b.gguf", "mmproj-a.gguf"], "Q4_K_M", "mmproj-a.gguf"),  # no tag: the first by name
    (["m-Q4_K_M.gguf", "mmproj-m-F16-00001-of-00002.gguf", "mmproj-m-F16-00002-of-00002.gguf"], None, None),
    (["m-Q4_K_M.gguf", "README.md"], "Q4_K_M", None),
])
def test_select_mmproj(paths: list[str], tag: str | None, chosen: str | None) -> None:
    assert select_mmproj(paths, tag) == chosen


@pytest.mark.parametrize(("name", "model", "projector"), [
    (f"{REPO}:Q8_0", "Tiny-VL-Q8_0.gguf", "mmproj-Tiny-VL-Q8_0.gguf"),
    (REPO, "Tiny-VL-Q4_K_M.gguf", "mmproj-Tiny-VL-F16.gguf"),
])
def test_the_projector_is_fetched_beside_the_model_and_found_offline(
        fake_hub: FakeHub, hub_settings: HubSettings, name: str, model: str, projector: str) -> None:
    fake_hub.add_repo(REPO, FILES)
    resolved = resolve_model(name, hub=hub_settings, stream=io.StringIO())
    assert fake_hub.downloaded(REPO) == {model, projector}
    assert resolved.path.name == model and resolved.mmproj == resolved.path.parent / projector
    assert resolved.mmproj.read_bytes() == FILES[projector]
    offline = HubSettings(endpoint=hub_settings.endpoint, cache_dir=hub_settings.cache_dir, token=None, offline=True)
    again = resolve_model(name, hub=offline)
    assert (again.path, again.mmproj) == (resolved.path, resolved.mmproj)


def _args(model: Path, repo_mmproj: Path | None, mmproj: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(model=str(model), repo_mmproj=None if repo_mmproj is None else str(repo_mmproj),
                              mmproj=mmproj)


def test_the_repo_projector_becomes_mmproj_for_a_qwen3_vl_language_model() -> None:
    pair = FIXTURES / "qwen3_vl_gguf"
    args = _args(pair / "lm-f16.gguf", pair / "mmproj-f16.gguf")
    _take_repo_mmproj(args)
    assert args.mmproj == str(pair / "mmproj-f16.gguf")


def test_the_repo_projector_is_left_for_other_models_and_for_an_explicit_mmproj() -> None:
    pair = FIXTURES / "qwen3_vl_gguf"
    text = _args(FIXTURES / "gguf" / "qwen3_quant" / "qwen3_quant.gguf", pair / "mmproj-f16.gguf")
    _take_repo_mmproj(text)
    assert text.mmproj is None  # a text model's repo projector (another family's tower) stays unused
    given = _args(pair / "lm-f16.gguf", pair / "mmproj-f16.gguf", mmproj=str(pair / "mmproj-q8_0.gguf"))
    _take_repo_mmproj(given)
    assert given.mmproj == str(pair / "mmproj-q8_0.gguf")


def test_serve_a_qwen3_vl_gguf_repo_takes_images_through_its_projector(fake_hub: FakeHub, tmp_path: Path) -> None:
    """``serve --model owner/name:F16`` on a repo laid out as Qwen's Qwen3-VL GGUF repos: the language model,
    and mmproj files beside it; the F16 projector is fetched with it and the server takes images."""
    import json
    import os
    import urllib.request

    from cli.cli_kit import start_serve, stop

    pair = FIXTURES / "qwen3_vl_gguf"
    repo = "Tiny/Qwen3VL-Tiny-GGUF"
    fake_hub.add_repo(repo, {"Qwen3VL-Tiny-F16.gguf": (pair / "lm-f16.gguf").read_bytes(),
                             "mmproj-Qwen3VL-Tiny-F16.gguf": (pair / "mmproj-f16.gguf").read_bytes(),
                             "mmproj-Qwen3VL-Tiny-Q8_0.gguf": (pair / "mmproj-q8_0.gguf").read_bytes()})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_ENDPOINT=fake_hub.url, HF_HOME=str(tmp_path / "hf"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               HF_HUB_DISABLE_TELEMETRY="1")
    process, url, _ = start_serve("--model", f"{repo}:F16", "--grace", "0", env=env)
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
            listed = json.load(response)["data"][0]
    finally:
        stop(process)
    assert listed["id"] == f"{repo}:F16" and listed["input_modalities"] == ["text", "image", *VIDEO]
    assert fake_hub.downloaded(repo) == {"Qwen3VL-Tiny-F16.gguf", "mmproj-Qwen3VL-Tiny-F16.gguf"}
