"""Issue 49 item 6: every file a model folder names resolves inside the folder (or its hub cache repo).

A symlink out (``chat_template.jinja -> /etc/passwd`` was served back through /tokenize) is a one-line
ModelLoadError naming the file; a Hugging Face cache snapshot, whose files are symlinks to ``../../blobs``,
keeps loading.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from hostile_text_kit import FIXTURE, copy_fixture

from kestrel_trio.errors import ModelLoadError
from kestrel_trio.model import load_model
from kestrel_trio.text.tokens.tokenizer import Tokenizer

# Each file kind a model folder may hold, and a valid body for the outside copy (so only the symlink is wrong).
_KINDS = {
    "config.json": None, "tokenizer.json": None, "tokenizer_config.json": None, "generation_config.json": None,
    "model.safetensors": None, "chat_template.jinja": "LEAKED {{ messages[0]['content'] }}",
    "chat_template.json": json.dumps({"chat_template": "LEAKED"}), "special_tokens_map.json": "{}",
    "preprocessor_config.json": "{}", "video_preprocessor_config.json": "{}",
    "model.safetensors.index.json": None,
}


def _link_out(tmp_path: Path, name: str) -> Path:
    """The fixture copied to tmp_path/m with ``name`` replaced by a symlink to a valid copy outside the folder."""
    folder = copy_fixture(tmp_path / "m")
    outside = tmp_path / "outside" / name
    outside.parent.mkdir()
    if name == "model.safetensors.index.json":
        # A valid index; the folder's own shard stays inside, only the index itself lies outside.
        from kestrel_trio._model.checkpoints.safetensors import _read_header

        names = [info.name for info in _read_header(folder / "model.safetensors")]
        outside.write_text(json.dumps({"weight_map": dict.fromkeys(names, "model.safetensors")}))
    elif _KINDS[name] is None:
        shutil.move(folder / name, outside)
    else:
        outside.write_text(_KINDS[name])
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(outside)
    return folder


@pytest.mark.parametrize("name", sorted(_KINDS))
def test_a_file_symlinked_out_of_the_folder_is_refused(tmp_path: Path, name: str) -> None:
    folder = _link_out(tmp_path, name)
    with pytest.raises(ModelLoadError) as refused:
        load_model(folder)
    message = refused.value.message
    assert name in message and "outside" in message and "\n" not in message, message


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                  "chat_template.jinja"])
def test_the_tokenizer_alone_refuses_a_symlink_out(tmp_path: Path, name: str) -> None:
    # Tokenizer.from_folder is reached without load_model too (check_draft_model, the tokenizer API).
    folder = _link_out(tmp_path, name)
    with pytest.raises(ModelLoadError) as refused:
        Tokenizer.from_folder(folder)
    assert name in refused.value.message and "outside" in refused.value.message


def test_a_template_linked_to_a_system_file_is_never_read(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path / "m")
    (folder / "chat_template.jinja").symlink_to("/etc/passwd")
    with pytest.raises(ModelLoadError) as refused:
        load_model(folder)
    assert "chat_template.jinja" in refused.value.message and "/etc/passwd" in refused.value.message


@pytest.mark.parametrize("name", ["../config.json", "/etc/passwd", "sub/../../x", "a\\..\\b", "", 7])
def test_a_name_that_leaves_the_folder_is_refused(tmp_path: Path, name: object) -> None:
    from kestrel_trio._model import confined

    with pytest.raises(ModelLoadError) as refused:
        confined(tmp_path, name, named_by="model.safetensors.index.json")
    assert refused.value.message.startswith("model.safetensors.index.json: ")


def _hub_snapshot(tmp_path: Path) -> Path:
    """The fixture laid out as a Hugging Face cache repo: snapshots/<rev>/<file> -> ../../blobs/<sha256>."""
    repo = tmp_path / "hub" / "models--owner--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    for path in sorted(FIXTURE.iterdir()):
        data = path.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / path.name).symlink_to(Path("..") / ".." / "blobs" / blob)
    (repo / "blobs" / "tpl").write_text("{% for m in messages %}<{{ m['content'] }}>{% endfor %}")
    (snapshot / "chat_template.jinja").symlink_to(Path("..") / ".." / "blobs" / "tpl")
    return snapshot


def test_a_hub_cache_snapshot_with_blob_symlinks_loads(tmp_path: Path) -> None:
    snapshot = _hub_snapshot(tmp_path)
    model = load_model(snapshot)
    assert model.tokenizer is not None and model.tokenizer.chat_template.startswith("{% for m in messages")
    assert model.config.vocab_size == load_model(FIXTURE).config.vocab_size
    assert Tokenizer.from_folder(snapshot).vocab_size == model.tokenizer.vocab_size


def test_a_hub_snapshot_file_linked_out_of_its_repo_is_refused(tmp_path: Path) -> None:
    snapshot = _hub_snapshot(tmp_path)
    (tmp_path / "secret").write_text("LEAKED")
    (snapshot / "chat_template.jinja").unlink()
    (snapshot / "chat_template.jinja").symlink_to(Path("..") / ".." / ".." / ".." / "secret")
    with pytest.raises(ModelLoadError) as refused:
        load_model(snapshot)
    assert "chat_template.jinja" in refused.value.message and "outside" in refused.value.message


def test_a_local_dir_linking_into_a_hub_cache_blob_loads(tmp_path: Path) -> None:
    # huggingface-cli download --local-dir linked big files into the cache's blobs before huggingface_hub 0.23.
    snapshot = _hub_snapshot(tmp_path)
    local = copy_fixture(tmp_path / "local")
    (local / "model.safetensors").unlink()
    (local / "model.safetensors").symlink_to((snapshot / "model.safetensors").resolve())
    assert load_model(local).config.vocab_size == load_model(FIXTURE).config.vocab_size


def test_a_link_to_a_blobs_folder_outside_a_hub_cache_repo_is_refused(tmp_path: Path) -> None:
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "t").write_text("LEAKED")
    folder = copy_fixture(tmp_path / "m")
    (folder / "chat_template.jinja").symlink_to(tmp_path / "blobs" / "t")
    with pytest.raises(ModelLoadError):
        load_model(folder)


def test_the_cli_exits_2_naming_the_linked_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    from hostile_text_kit import SRC

    folder = copy_fixture(tmp_path / "m")
    (folder / "chat_template.jinja").symlink_to("/etc/passwd")
    done = subprocess.run([sys.executable, "-m", "kestrel_trio.cli", "generate", "hi", "--model", str(folder)],
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": SRC, "PATH": "/usr/bin"})
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(errors) == 1 and "chat_template.jinja" in errors[0] and "outside" in errors[0], done.stderr[-2000:]
