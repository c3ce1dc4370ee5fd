"""``kestrel-trio pull``, ``list``, ``rm`` and ``--model owner/name``, run as a user would: subprocesses of the real CLI.

The stand-in hub (tests/hub_server.py) runs in this process; each command gets
HF_ENDPOINT pointed at it and HF_HOME / XDG_CACHE_HOME in a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from cli.cli_kit import start_serve, stop
from hub_server import FakeHub
from real_models import smollm2_135m

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"
CLI = [sys.executable, "-m", "kestrel_trio.cli"]
REPO = "Tiny/Qwen3-Tiny"


@pytest.fixture
def env(tmp_path: Path, fake_hub: FakeHub) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    environment.update(HF_ENDPOINT=fake_hub.url, HF_HOME=str(tmp_path / "hf"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
                       HF_HUB_DISABLE_TELEMETRY="1")
    return environment


def _run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), env=env, capture_output=True, text=True, timeout=timeout, encoding="utf-8")


def _rows(listing: str) -> dict[str, list[str]]:
    """``kestrel-trio list``'s table: id -> [format, size, path]."""
    lines = listing.splitlines()
    assert lines[0].split() == ["ID", "FORMAT", "SIZE", "PATH"], listing
    rows = {}
    for line in lines[1:]:
        model_id, model_format, number, unit, path = line.split(maxsplit=4)
        rows[model_id] = [model_format, f"{number} {unit}", path]
    return rows


def test_pull_list_generate_and_rm_a_hub_repo(fake_hub: FakeHub, env: dict[str, str], tmp_path: Path):
    fake_hub.add_folder(REPO, FIXTURE, {"README.md": b"# tiny\n"})
    pulled = _run(env, "pull", REPO)
    assert pulled.returncode == 0, pulled.stderr
    snapshot = Path(pulled.stdout.strip())
    assert snapshot.is_dir() and snapshot.is_relative_to(tmp_path / "hf" / "hub" / "models--Tiny--Qwen3-Tiny")
    assert f"pulled {REPO}" in pulled.stderr and f"downloading {REPO}: 100%" in pulled.stderr
    gets = dict(fake_hub.gets[REPO])
    again = _run(env, "pull", REPO)
    assert again.returncode == 0 and "already cached: nothing downloaded" in again.stderr
    assert dict(fake_hub.gets[REPO]) == gets and "README.md" not in gets

    listed = _run(env, "list")
    assert listed.returncode == 0, listed.stderr
    assert _rows(listed.stdout)[REPO][0] == "safetensors" and _rows(listed.stdout)[REPO][2] == str(snapshot)

    generated = _run(env, "--log-level", "WARNING", "generate", "hi", "--model", REPO, "--max-tokens", "3",
                     "--temperature", "0", "--no-think")
    assert generated.returncode == 0, generated.stderr
    assert dict(fake_hub.gets[REPO]) == gets  # generate found it in the cache

    removed = _run(env, "rm", REPO)
    assert removed.returncode == 0 and removed.stdout.startswith(f"removed {REPO} ("), removed.stderr
    assert not snapshot.exists()
    assert "no models cached" in _run(env, "list").stderr
    gone = _run(env, "rm", REPO)
    assert gone.returncode == 2 and gone.stderr.startswith(f"kestrel-trio: error: {REPO} is not cached")


def test_gguf_quant_tags_are_pulled_listed_and_removed_one_by_one(fake_hub: FakeHub, env: dict[str, str]):
    fake_hub.add_repo("Tiny/Tiny-GGUF", {"Tiny-Q4_K_M.gguf": b"GGUF a" * 100, "Tiny-Q8_0.gguf": b"GGUF b" * 200,
                                         "README.md": b"# tiny\n"})
    for tag in ("Q4_K_M", "q8_0"):
        assert _run(env, "pull", f"Tiny/Tiny-GGUF:{tag}").returncode == 0
    rows = _rows(_run(env, "list").stdout)
    assert sorted(rows) == ["Tiny/Tiny-GGUF:Q4_K_M", "Tiny/Tiny-GGUF:Q8_0"]
    assert rows["Tiny/Tiny-GGUF:Q8_0"][:2] == ["gguf", "1.2 KiB"] and rows["Tiny/Tiny-GGUF:Q8_0"][2].endswith(
        "/Tiny-Q8_0.gguf")
    assert _run(env, "rm", "Tiny/Tiny-GGUF:Q8_0").returncode == 0
    assert sorted(_rows(_run(env, "list").stdout)) == ["Tiny/Tiny-GGUF:Q4_K_M"]
    missing = _run(env, "pull", "Tiny/Tiny-GGUF:Q2_K")
    assert missing.returncode == 2 and missing.stderr == (
        "kestrel-trio: error: Tiny/Tiny-GGUF:Q2_K has no GGUF file with quant tag Q2_K; its tags: Q4_K_M, Q8_0\n")


def test_offline_with_an_empty_cache_is_one_error_line_and_exit_code_2(env: dict[str, str], tmp_path: Path):
    result = _run({**env, "HF_HUB_OFFLINE": "1"}, "serve", "--port", "0", "--model", "Qwen/Qwen3-0.6B")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"kestrel-trio: error: Qwen/Qwen3-0.6B is not in the local cache ({tmp_path / 'hf' / 'hub'}) and "
        "HF_HUB_OFFLINE is set, so nothing can be downloaded"]


@pytest.mark.parametrize("command", [["pull", "smollm2"], ["pull", "smollm2-135M"], ["rm", "smollm2"],
                                     ["serve", "--port", "0", "--model", "smollm-135m"],
                                     ["generate", "--model", "smollm2-135M", "hi"]])
def test_a_near_miss_of_a_named_model_is_one_line_naming_it(env: dict[str, str], command: list[str]):
    result = _run(env, *command)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("kestrel-trio: error: ") and "did you mean smollm2-135m?" in line, line


def test_hf_token_opens_a_gated_repo(fake_hub: FakeHub, env: dict[str, str]):
    fake_hub.add_folder("Gate/Kept", FIXTURE, gated=True)
    refused = _run(env, "pull", "Gate/Kept")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("kestrel-trio: error: Gate/Kept is a gated repo: accept its conditions at ")
    allowed = _run({**env, "HF_TOKEN": fake_hub.token}, "pull", "Gate/Kept")
    assert allowed.returncode == 0, allowed.stderr


def test_serve_a_repo_id_under_its_own_name(fake_hub: FakeHub, env: dict[str, str]):
    fake_hub.add_folder(REPO, FIXTURE)
    process, url, _ = start_serve("--model", REPO, "--grace", "1", env=env)
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as response:
            assert [m["id"] for m in json.load(response)["data"]] == [REPO]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        stop(process)


def test_the_named_model_is_listed_found_and_removed(env: dict[str, str], tmp_path: Path):
    source = smollm2_135m()  # the user's cache: fetched from PyPI at most once (tests/real_models.py)
    cache = tmp_path / "xdg" / "kestrel-trio" / "models"
    cache.mkdir(parents=True)
    target = cache / source.name
    try:
        os.link(source, target)  # this test's own cache, without copying 98 MB where the disk allows
    except OSError:
        shutil.copyfile(source, target)
    pulled = _run({**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path)}, "pull", "smollm2-135m")
    assert pulled.returncode == 0 and pulled.stdout.strip() == str(target), pulled.stderr
    assert "smollm2-135m is already cached: nothing downloaded" in pulled.stderr
    assert _rows(_run(env, "list").stdout)["smollm2-135m"] == ["gguf", "93.8 MiB", str(target)]
    removed = _run(env, "rm", "smollm2-135m")
    assert removed.stdout == "removed smollm2-135m (93.8 MiB freed)\n" and not target.exists() and source.exists()
