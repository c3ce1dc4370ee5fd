"""Hub repo ids against a stand-in hub on 127.0.0.1 (tests/hub_server.py) through the real huggingface_hub."""

from __future__ import annotations

import io
from pathlib import Path

import attrs
import numpy as np
import pytest
from hub_server import FakeHub

from kestrel_trio import ModelLoadError, load_model
from kestrel_trio.hub import HubSettings, resolve_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = FIXTURES / "qwen3_bf16_tied"  # a real tiny Qwen3 checkpoint with tokenizer and chat template
REPO = "Tiny/Qwen3-Tiny"
NEEDED = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
# Files a real repo carries that kestrel-trio never reads (the fixture's golden.npz and meta.json among them).
NOT_NEEDED = {
    "README.md": b"# Tiny\n", ".gitattributes": b"*.safetensors filter=lfs\n", "pytorch_model.bin": b"\0" * 4096,
    "onnx/model.onnx": b"\1" * 4096, "original/consolidated.safetensors": b"\2" * 4096,
    "preprocessor_config.json": b"{}",  # only a Qwen3-VL reads it
}
PROMPT = [1, 5, 9, 42, 7, 300]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _logits(path: Path) -> np.ndarray:
    return load_model(path).logits(PROMPT)


@pytest.fixture(scope="module")
def local_logits() -> np.ndarray:
    return _logits(TINY)


def test_a_repo_id_downloads_only_the_files_the_model_needs_once(fake_hub: FakeHub, hub_settings: HubSettings):
    fake_hub.add_folder(REPO, TINY, NOT_NEEDED)
    terminal = _Terminal()
    resolved = resolve_model(REPO, hub=hub_settings, stream=terminal)
    assert fake_hub.downloaded(REPO) == NEEDED
    assert all(count == 1 for count in fake_hub.gets[REPO].values()), fake_hub.gets[REPO]
    assert resolved.source == "hub" and resolved.model_id == REPO
    assert resolved.path.parent.parent.name == "models--Tiny--Qwen3-Tiny"
    assert sorted(p.name for p in resolved.path.iterdir()) == sorted(NEEDED)
    assert resolved.downloaded == sum((TINY / name).stat().st_size for name in NEEDED)
    assert "\rdownloading Tiny/Qwen3-Tiny [" in terminal.getvalue() and "100%" in terminal.getvalue()
    # Again: only the revision info is asked for; no file is requested, nothing downloaded.
    heads, calls = sum(fake_hub.heads[REPO].values()), fake_hub.api_calls
    again = resolve_model(REPO, hub=hub_settings, stream=io.StringIO())
    assert again.path == resolved.path and again.downloaded == 0
    assert all(count == 1 for count in fake_hub.gets[REPO].values())
    assert sum(fake_hub.heads[REPO].values()) == heads and fake_hub.api_calls == calls + 1


def test_a_download_cut_in_the_middle_resumes_and_gives_the_local_folders_logits(
        fake_hub: FakeHub, hub_settings: HubSettings, local_logits: np.ndarray, monkeypatch: pytest.MonkeyPatch):
    from huggingface_hub import constants

    # huggingface_hub writes what arrives in DOWNLOAD_CHUNK_SIZE pieces (10 MiB) and resumes after the last whole
    # one; the fixture's weights are 211 KiB, so pieces of 16 KiB put the resume point inside the file.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    fake_hub.add_folder(REPO, TINY)
    size = (TINY / "model.safetensors").stat().st_size
    fake_hub.cut_after["model.safetensors"] = 100_000
    resolved = resolve_model(REPO, hub=hub_settings, stream=io.StringIO())
    resumed_at = 6 * 16 * 1024  # the whole pieces before the cut
    assert fake_hub.ranges["model.safetensors"] == [None, f"bytes={resumed_at}-"]
    assert fake_hub.body_bytes["model.safetensors"] == size + 100_000 - resumed_at  # not the whole file again
    assert (resolved.path / "model.safetensors").read_bytes() == (TINY / "model.safetensors").read_bytes()
    np.testing.assert_array_equal(_logits(resolved.path), local_logits)


def test_a_large_file_cut_after_its_first_10_mib_resumes_from_there(fake_hub: FakeHub, hub_settings: HubSettings):
    data = np.random.default_rng(0).bytes(12 * 2**20)
    fake_hub.add_repo("Tiny/Big-GGUF", {"Big-Q8_0.gguf": data})
    fake_hub.cut_after["Big-Q8_0.gguf"] = 11 * 2**20
    resolved = resolve_model("Tiny/Big-GGUF:Q8_0", hub=hub_settings, stream=io.StringIO())
    assert fake_hub.ranges["Big-Q8_0.gguf"] == [None, f"bytes={10 * 2**20}-"]
    assert resolved.path.read_bytes() == data


def test_a_failed_download_is_one_line_and_the_next_run_fetches_only_what_is_missing(
        fake_hub: FakeHub, hub_settings: HubSettings):
    fake_hub.add_folder(REPO, TINY)
    fake_hub.broken.add("model.safetensors")
    with pytest.raises(ModelLoadError) as failed:
        resolve_model(REPO, hub=hub_settings, stream=io.StringIO())
    assert failed.value.code == "download_failed" and "\n" not in failed.value.message
    assert failed.value.message == f"{REPO}: downloading model.safetensors failed: {fake_hub.url} answered HTTP 500"
    fake_hub.broken.clear()
    resolve_model(REPO, hub=hub_settings, stream=io.StringIO())
    assert fake_hub.gets[REPO]["model.safetensors"] == 2  # the failed try and the good one
    assert all(count == 1 for name, count in fake_hub.gets[REPO].items() if name != "model.safetensors")


def test_files_fetched_by_huggingface_hub_itself_are_not_fetched_again(fake_hub: FakeHub, hub_settings: HubSettings):
    from huggingface_hub import hf_hub_download

    fake_hub.add_folder(REPO, TINY)
    for name in ("config.json", "model.safetensors"):  # as `hf download` or transformers would have
        hf_hub_download(REPO, name, cache_dir=hub_settings.cache_dir, endpoint=hub_settings.endpoint, token=False)
    resolve_model(REPO, hub=hub_settings, stream=io.StringIO())
    assert fake_hub.gets[REPO]["model.safetensors"] == 1 and fake_hub.gets[REPO]["config.json"] == 1
    assert fake_hub.downloaded(REPO) == NEEDED


def test_a_sharded_checkpoint_fetches_the_shards_its_index_names(fake_hub: FakeHub, hub_settings: HubSettings):
    folder = FIXTURES / "qwen3_bf16_sharded"
    fake_hub.add_folder("Tiny/Sharded", folder, {"consolidated.safetensors": b"\3" * 4096})
    resolved = resolve_model("Tiny/Sharded", hub=hub_settings, stream=io.StringIO())
    shards = {f"model-0000{i}-of-00005.safetensors" for i in range(1, 6)}
    assert fake_hub.downloaded("Tiny/Sharded") == {"config.json", "generation_config.json",
                                                   "model.safetensors.index.json", *shards}
    np.testing.assert_array_equal(_logits(resolved.path), _logits(folder))


def test_a_qwen3_vl_repo_also_fetches_its_preprocessor_config(fake_hub: FakeHub, hub_settings: HubSettings):
    folder = FIXTURES / "qwen3_vl"
    fake_hub.add_folder("Tiny/VL", folder, {"video_preprocessor_config.json": b"{}"})
    resolve_model("Tiny/VL", hub=hub_settings, stream=io.StringIO())
    assert fake_hub.downloaded("Tiny/VL") == {"config.json", "generation_config.json", "tokenizer.json",
                                              "tokenizer_config.json", "chat_template.jinja", "model.safetensors",
                                              "preprocessor_config.json"}


def test_a_revision_is_fetched_and_recorded_for_offline_use(fake_hub: FakeHub, hub_settings: HubSettings):
    main_files = {p.name: p.read_bytes() for p in TINY.iterdir()}
    v1_files = {**main_files, "generation_config.json": b'{"temperature": 0.25}'}
    fake_hub.add_repo(REPO, main_files, revisions={"v1": v1_files})
    resolved = resolve_model(f"{REPO}@v1", hub=hub_settings, stream=io.StringIO())
    assert (resolved.path / "generation_config.json").read_bytes() == b'{"temperature": 0.25}'
    offline = resolve_model(f"{REPO}@v1", hub=attrs.evolve(hub_settings, offline=True))
    assert offline.path == resolved.path
    with pytest.raises(ModelLoadError) as missing:
        resolve_model(f"{REPO}@v2", hub=hub_settings)
    assert missing.value.code == "revision_not_found" and "'v2'" in missing.value.message


def test_offline_with_an_empty_cache_is_one_line_naming_the_repo_and_the_reason(hub_settings: HubSettings):
    with pytest.raises(ModelLoadError) as refused:
        resolve_model("Qwen/Qwen3-0.6B", hub=attrs.evolve(hub_settings, offline=True))
    message = refused.value.message
    assert refused.value.code == "not_cached" and "\n" not in message
    assert "Qwen/Qwen3-0.6B" in message and "HF_HUB_OFFLINE" in message and str(hub_settings.cache_dir) in message


def test_offline_with_the_model_cached_uses_the_cache_without_asking_the_hub(
        fake_hub: FakeHub, hub_settings: HubSettings):
    fake_hub.add_folder(REPO, TINY)
    online = resolve_model(REPO, hub=hub_settings, stream=io.StringIO())
    calls = fake_hub.api_calls
    offline = resolve_model(REPO, hub=attrs.evolve(hub_settings, offline=True))
    assert offline.path == online.path and offline.downloaded == 0 and fake_hub.api_calls == calls


def test_an_unreachable_hub_falls_back_to_the_cache_or_says_why(fake_hub: FakeHub, hub_settings: HubSettings):
    unreachable = attrs.evolve(hub_settings, endpoint="http://127.0.0.1:9")  # the discard port: refused
    with pytest.raises(ModelLoadError) as refused:
        resolve_model(REPO, hub=unreachable)
    assert refused.value.code == "not_cached" and "http://127.0.0.1:9 cannot be reached" in refused.value.message
    fake_hub.add_folder(REPO, TINY)
    online = resolve_model(REPO, hub=hub_settings, stream=io.StringIO())
    assert resolve_model(REPO, hub=unreachable).path == online.path


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("hf_someone_else", 404)])
def test_an_unknown_repo_is_one_line(hub_settings: HubSettings, token: str | None, status: int):
    with pytest.raises(ModelLoadError) as refused:
        resolve_model("Nobody/Nothing", hub=attrs.evolve(hub_settings, token=token))
    message = refused.value.message
    assert refused.value.code == "repo_not_found" and "\n" not in message
    assert "Nobody/Nothing" in message and f"HTTP {status}" in message
    assert ("HF_TOKEN" in message) == (token is None)


def test_a_gated_repo_needs_the_right_token(fake_hub: FakeHub, hub_settings: HubSettings):
    fake_hub.add_folder("Gate/Kept", TINY, gated=True)
    with pytest.raises(ModelLoadError) as no_token:
        resolve_model("Gate/Kept", hub=hub_settings)
    assert no_token.value.code == "gated" and "HF_TOKEN" in no_token.value.message
    assert f"{fake_hub.url}/Gate/Kept" in no_token.value.message and "\n" not in no_token.value.message
    with pytest.raises(ModelLoadError) as wrong_token:
        resolve_model("Gate/Kept", hub=attrs.evolve(hub_settings, token="hf_wrong"))
    assert wrong_token.value.code == "gated" and "HTTP 403" in wrong_token.value.message
    assert fake_hub.downloaded("Gate/Kept") == set()
    resolved = resolve_model("Gate/Kept", hub=attrs.evolve(hub_settings, token=fake_hub.token), stream=io.StringIO())
    assert (resolved.path / "model.safetensors").is_file()


GGUF_REPO = "Tiny/Tiny-GGUF"
GGUF_FILES = {
    "Tiny-Q4_K_M.gguf": b"GGUF q4km", "Tiny-Q8_0.gguf": b"GGUF q8",
    "Tiny-Q6_K-00001-of-00002.gguf": b"GGUF q6k part 1", "Tiny-Q6_K-00002-of-00002.gguf": b"GGUF q6k part 2",
    "mmproj-Tiny-F16.gguf": b"GGUF projector", "README.md": b"# Tiny GGUF\n",
}


@pytest.mark.parametrize(("name", "files"), [
    (f"{GGUF_REPO}:Q6_K", ["Tiny-Q6_K-00001-of-00002.gguf", "Tiny-Q6_K-00002-of-00002.gguf"]),
    (f"{GGUF_REPO}:q8_0", ["Tiny-Q8_0.gguf"]),
    (GGUF_REPO, ["Tiny-Q4_K_M.gguf"]),  # no tag: Q4_K_M, as llama.cpp picks
])
def test_a_quant_tag_picks_its_gguf_file_and_every_shard(fake_hub: FakeHub, hub_settings: HubSettings, name, files):
    fake_hub.add_repo(GGUF_REPO, GGUF_FILES)
    resolved = resolve_model(name, hub=hub_settings, stream=io.StringIO())
    assert fake_hub.downloaded(GGUF_REPO) == set(files) | {"mmproj-Tiny-F16.gguf"}  # the projector, as -hf does
    assert resolved.mmproj == resolved.path.parent / "mmproj-Tiny-F16.gguf"
    assert resolved.path.name == files[0] and resolved.path.read_bytes() == GGUF_FILES[files[0]]
    assert all((resolved.path.parent / f).is_file() for f in files)
    assert resolved.model_id == name


def test_a_quant_tag_that_does_not_exist_lists_the_tags_that_do(fake_hub: FakeHub, hub_settings: HubSettings):
    fake_hub.add_repo(GGUF_REPO, GGUF_FILES)
    with pytest.raises(ModelLoadError) as refused:
        resolve_model(f"{GGUF_REPO}:Q2_K", hub=hub_settings)
    assert refused.value.code == "no_such_quant"
    assert refused.value.message == f"{GGUF_REPO}:Q2_K has no GGUF file with quant tag Q2_K; its tags: Q4_K_M, Q6_K, Q8_0"
    assert fake_hub.downloaded(GGUF_REPO) == set()


def test_not_enough_disk_is_refused_before_the_weights_download(fake_hub: FakeHub, hub_settings: HubSettings):
    fake_hub.add_folder(REPO, TINY)
    fake_hub.claimed_sizes["model.safetensors"] = 2**62  # 4 EiB: no disk here holds it
    with pytest.raises(ModelLoadError) as refused:
        resolve_model(REPO, hub=hub_settings)
    assert refused.value.code == "disk_full" and REPO in refused.value.message and "free" in refused.value.message
    assert fake_hub.downloaded(REPO) == {"config.json"}  # read to know the weights; nothing else was fetched


def test_a_repo_without_config_or_gguf_is_not_a_model(fake_hub: FakeHub, hub_settings: HubSettings):
    fake_hub.add_repo("Tiny/Docs", {"README.md": b"# just docs\n"})
    with pytest.raises(ModelLoadError) as refused:
        resolve_model("Tiny/Docs", hub=hub_settings)
    assert refused.value.code == "not_a_model" and "config.json" in refused.value.message


def test_list_and_rm_see_each_revision_under_the_name_model_takes(fake_hub: FakeHub, hub_settings: HubSettings,
                                                                  tmp_path: Path):
    from kestrel_trio.hub import cached_models, remove_model

    files = {p.name: p.read_bytes() for p in TINY.iterdir()}
    fake_hub.add_repo(REPO, files, revisions={"v1": {**files, "generation_config.json": b"{}"}})
    main = resolve_model(REPO, hub=hub_settings, stream=io.StringIO())
    v1 = resolve_model(f"{REPO}@v1", hub=hub_settings, stream=io.StringIO())
    kestrel_cache = tmp_path / "kestrel"
    rows = {row.id: row for row in cached_models(hub_settings.cache_dir, kestrel_cache)}
    assert sorted(rows) == [REPO, f"{REPO}@v1"] and rows[f"{REPO}@v1"].format == "safetensors"
    assert sorted(p.name for p in v1.path.iterdir()) == sorted(NEEDED)  # blobs shared with main linked in
    assert v1.downloaded == len(b"{}") and fake_hub.gets[REPO]["model.safetensors"] == 1
    assert (rows[REPO].path, rows[f"{REPO}@v1"].path) == (main.path, v1.path)
    assert rows[REPO].format == "safetensors" and rows[REPO].size == sum(p.stat().st_size for p in main.path.iterdir())
    freed = remove_model(f"{REPO}@v1", hub_settings.cache_dir, kestrel_cache)
    assert freed == len(b"{}")  # the other files' blobs are shared with main and stay
    assert [row.id for row in cached_models(hub_settings.cache_dir, kestrel_cache)] == [REPO]
    assert main.path.is_dir() and not v1.path.exists()
    with pytest.raises(ModelLoadError) as missing:
        remove_model(f"{REPO}@v1", hub_settings.cache_dir, kestrel_cache)
    assert missing.value.code == "not_cached"


def test_a_revision_with_dot_dots_reads_and_writes_nothing_outside_the_cache(hub_settings: HubSettings):
    # refs/../../x would be <cache>/x: a file planted there (or one a hostile mirror made pull write) is never used
    storage = hub_settings.cache_dir / "models--owner--name"
    (storage / "snapshots").mkdir(parents=True)
    (hub_settings.cache_dir / "x").write_text("../../../../etc")
    for offline in (True, False):
        with pytest.raises(ModelLoadError) as refused:
            resolve_model("owner/name@../../x", hub=attrs.evolve(hub_settings, offline=offline))
        assert "'../../x'" in refused.value.message and "\n" not in refused.value.message
    assert sorted(p.name for p in hub_settings.cache_dir.iterdir()) == ["models--owner--name", "x"]
