"""What a --model value names, which GGUF file a quant tag picks, and how download progress shows (no network)."""

from __future__ import annotations

import io
import logging

import pytest

from kestrel_trio import ModelLoadError
from kestrel_trio.hub.gguf_files import parse_gguf_name, quant_tags, select_gguf
from kestrel_trio.hub.names import HubRepo, LocalModel, NamedRef, parse_model_name
from kestrel_trio.hub.progress import DownloadProgress, format_bytes
from kestrel_trio.model import check_model_folder

NAMED = frozenset({"smollm2-135m"})


@pytest.mark.parametrize(("text", "expected"), [
    ("Qwen/Qwen3-0.6B", HubRepo("Qwen/Qwen3-0.6B")),
    ("Qwen/Qwen3-0.6B@a1b2c3", HubRepo("Qwen/Qwen3-0.6B", revision="a1b2c3")),
    ("Qwen/Qwen3-8B-GGUF:Q4_K_M", HubRepo("Qwen/Qwen3-8B-GGUF", tag="Q4_K_M")),
    ("Qwen/Qwen3-8B-GGUF:q8_0", HubRepo("Qwen/Qwen3-8B-GGUF", tag="Q8_0")),
    ("Qwen/Qwen3-8B-GGUF:Q8_0@v2", HubRepo("Qwen/Qwen3-8B-GGUF", revision="v2", tag="Q8_0")),
    ("Qwen/Qwen3-8B-GGUF@v2:Q8_0", HubRepo("Qwen/Qwen3-8B-GGUF", revision="v2", tag="Q8_0")),
    ("smollm2-135m", NamedRef("smollm2-135m")),
])
def test_names_that_are_not_paths(text, expected):
    assert parse_model_name(text, NAMED) == expected


def test_an_existing_path_wins_over_a_repo_id_or_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen" / "Qwen3-0.6B").mkdir(parents=True)
    (tmp_path / "smollm2-135m").mkdir()
    (tmp_path / "m.GGUF").write_bytes(b"GGUF")
    assert parse_model_name("Qwen/Qwen3-0.6B", NAMED) == LocalModel(tmp_path.joinpath("Qwen/Qwen3-0.6B").relative_to(tmp_path))
    assert isinstance(parse_model_name("smollm2-135m", NAMED), LocalModel)
    assert isinstance(parse_model_name("m.GGUF", NAMED), LocalModel)


@pytest.mark.parametrize(("text", "says"), [
    ("missing.gguf", "missing.gguf: no such checkpoint folder or GGUF file"),
    ("./nowhere", "./nowhere: no such checkpoint folder or GGUF file"),
    ("qwen3", "is not a folder, a .gguf file, a hub repo id"),
    ("a/b/c", "is not a folder, a .gguf file, a hub repo id"),
    ("bad--name/x", "is not a folder, a .gguf file, a hub repo id"),
])
def test_names_that_are_nothing_say_so_in_one_line(text, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as refused:
        parse_model_name(text, NAMED)
    assert says in refused.value.message and "\n" not in refused.value.message


@pytest.mark.parametrize("text", ["smollm2", "smollm2-135M", "SMOLLM2-135M", "smollm-135m", "smolm2-135m",
                                  "SmolLM2-135M-Instruct", "smol"])
def test_a_near_miss_of_a_named_model_is_told_the_name(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as refused:
        parse_model_name(text, NAMED)
    message = refused.value.message
    assert message.startswith(f"{text!r} is not a named model: did you mean smollm2-135m?"), message
    assert "\n" not in message and "e.g. Qwen/Qwen3-0.6B" not in message  # one line, not the generic list of forms


@pytest.mark.parametrize("text", ["qwen3", "llama", "x"])
def test_a_name_near_nothing_gets_no_suggestion(text):
    from kestrel_trio.hub.names import close_names

    assert close_names(text, NAMED) == []


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    # An existing path is the loader's to judge: the name resolves to it, and the loader's own check refuses it.
    (tmp_path / "model.bin").write_bytes(b"\0")
    assert parse_model_name(str(tmp_path / "model.bin"), NAMED) == LocalModel(tmp_path / "model.bin")
    with pytest.raises(ModelLoadError, match="not a folder .* or a GGUF file"):
        check_model_folder(tmp_path / "model.bin")


@pytest.mark.parametrize(("path", "prefix", "tag", "index", "count"), [
    ("Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B-Q4_K_M", "Q4_K_M", 1, 1),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1", "Q4_1", 1, 1),
    ("qwen2.5-7b-instruct-q5_k_m-00002-of-00003.gguf", "qwen2.5-7b-instruct-q5_k_m", "Q5_K_M", 2, 3),
    ("Q4_K_M/Qwen3-30B-A3B-UD-Q4_K_XL-00001-of-00002.gguf", "Q4_K_M/Qwen3-30B-A3B-UD-Q4_K_XL", "Q4_K_XL", 1, 2),
    ("model.gguf", "model", None, 1, 1),
])
def test_a_gguf_file_name_gives_its_tag_and_shard(path, prefix, tag, index, count):
    name = parse_gguf_name(path)
    assert (name.prefix, name.tag, name.index, name.count) == (prefix, tag, index, count)
    assert parse_gguf_name("config.json") is None


FILES = ["Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B-Q8_0.gguf", "Qwen3-8B-IQ4_NL.gguf", "mmproj-Qwen3-8B-F16.gguf",
         "Qwen3-8B-BF16-00001-of-00002.gguf", "Qwen3-8B-BF16-00002-of-00002.gguf", "imatrix.gguf", "README.md"]


def test_tags_are_matched_whole_and_without_case():
    assert select_gguf(FILES, "q8_0", repo="r") == ["Qwen3-8B-Q8_0.gguf"]
    assert select_gguf(FILES, "BF16", repo="r") == ["Qwen3-8B-BF16-00001-of-00002.gguf",
                                                    "Qwen3-8B-BF16-00002-of-00002.gguf"]
    assert select_gguf(FILES, "IQ4_NL", repo="r") == ["Qwen3-8B-IQ4_NL.gguf"]
    assert quant_tags(FILES) == ["BF16", "IQ4_NL", "Q4_K_M", "Q8_0"]  # no projector, no imatrix


def test_without_a_tag_the_choice_is_llama_cpps():
    assert select_gguf(FILES, None, repo="r") == ["Qwen3-8B-Q4_K_M.gguf"]
    assert select_gguf(FILES[1:], None, repo="r") == ["Qwen3-8B-Q8_0.gguf"]
    assert select_gguf(["b-Q5_0.gguf", "a-Q6_K.gguf"], None, repo="r") == ["a-Q6_K.gguf"]


def test_a_missing_tag_lists_the_tags_and_a_missing_shard_is_named():
    with pytest.raises(ModelLoadError, match=r"^o/r has no GGUF file with quant tag Q4_0; its tags: BF16, IQ4_NL, "
                                             r"Q4_K_M, Q8_0$"):
        select_gguf(FILES, "Q4_0", repo="o/r")
    with pytest.raises(ModelLoadError, match="shard 2 of 3 is not in the repo"):
        select_gguf(["m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf"], "Q8_0", repo="o/r")
    with pytest.raises(ModelLoadError, match="has no GGUF model file"):
        select_gguf(["README.md", "mmproj-F16.gguf"], None, repo="o/r")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal():
    terminal = _Terminal()
    progress = DownloadProgress("o/r", 2 * 2**20, terminal)
    bar = progress.tqdm_class()(total=2**20, initial=0, desc="x", unit="B", unit_scale=True)
    with bar:
        bar.update(2**20)
    progress.add(2**20)
    progress.finish()
    shown = terminal.getvalue()
    assert shown.startswith("\rdownloading o/r [") and "100% 2.0 MiB of 2.0 MiB" in shown and shown.endswith("\n")


def test_progress_is_a_log_line_every_tenth_elsewhere(caplog):
    caplog.set_level(logging.INFO, logger="kestrel_trio.hub")
    progress = DownloadProgress("o/r", 1000, io.StringIO())
    for _ in range(40):
        progress.add(25)
    progress.finish()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 10 and lines[0].startswith("downloading o/r: 10% (100 B of 1000 B")
    assert lines[-1].startswith("downloading o/r: 100% (1000 B of 1000 B")


def test_bytes_read_as_people_write_them():
    assert [format_bytes(n) for n in (512, 98_362_432, 3 * 2**30 // 2)] == ["512 B", "93.8 MiB", "1.5 GiB"]


@pytest.mark.parametrize("revision", ["../../x", "x/../../y", "/etc/passwd", ".hidden", "main.lock", "a\\b", "..",
                                      "a//b", "v1.", "x/.git/y"])
def test_a_revision_that_is_no_git_ref_is_refused_naming_it(revision):
    with pytest.raises(ModelLoadError) as refused:
        parse_model_name(f"owner/name@{revision}", NAMED)
    assert repr(revision) in refused.value.message and "\n" not in refused.value.message


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "feature/x-y_z", "a" * 40, "a1b2c3"])
def test_git_refs_and_commit_ids_are_revisions(revision):
    assert parse_model_name(f"owner/name@{revision}", NAMED) == HubRepo("owner/name", revision=revision)
