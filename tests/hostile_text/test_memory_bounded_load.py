"""Issue 49 item 4 under a memory bound: a tiny model file whose metadata claims huge sizes is refused with its
one-line ModelLoadError before anything is allocated from them, inside an address-space limit of the child's own
size after importing kestrel_trio plus ``ROOM`` (a same-run baseline, never an absolute figure): not a
MemoryError, not a kill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf_header_kit import gguf_bytes
from hostile_text_kit import copy_fixture, run_child

ROOM = 256 * 2**20  # bytes above the baseline; a valid file's config check fits in it (the control case below)


def _check_under_limit(path: Path) -> dict:
    code, result, stderr = run_child(f"""
        import kestrel_trio
        from kestrel_trio.errors import ModelLoadError
        from kestrel_trio.model import check_model_folder, load_model
        base = vm_size()  # the baseline: this child, everything imported
        limit({ROOM})
        try:
            check_model_folder({str(path)!r})
            load_model({str(path)!r}) if {path.is_dir()!r} else None
            report(kind="loaded")
        except ModelLoadError as exc:
            report(kind="refused", message=exc.message)
        except MemoryError:
            report(kind="MemoryError")
    """, timeout=120)
    assert code == 0 and result is not None, stderr
    return result


@pytest.mark.parametrize(("arch", "changes", "key"), [
    ("qwen3moe", {"block_count": 1 << 31}, "qwen3moe.block_count"),  # a per-layer list of 2^31 before the check
    ("llama", {"block_count": (1 << 64) - 1}, "llama.block_count"),
    ("qwen3", {"block_count": 1 << 31, "attention__key_length": 8}, "qwen3.block_count"),
])
def test_a_gguf_claiming_billions_of_layers_is_refused_within_the_bound(tmp_path: Path, arch: str, changes: dict,
                                                                       key: str) -> None:
    path = tmp_path / "huge.gguf"
    path.write_bytes(gguf_bytes(arch, **changes))
    result = _check_under_limit(path)
    assert result["kind"] == "refused", result
    assert result["message"].startswith("huge.gguf") and key in result["message"] and "\n" not in result["message"]


def test_a_config_claiming_a_billion_layers_is_refused_within_the_bound(tmp_path: Path) -> None:
    folder = copy_fixture(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10**9, "vocab_size": 1 << 40}))
    result = _check_under_limit(folder)
    assert result["kind"] == "refused" and "config.json" in result["message"], result


def test_the_control_a_valid_file_loads_within_the_same_bound(tmp_path: Path) -> None:
    # Without this, a refusal above could be the limit's doing rather than the check's.
    path = tmp_path / "fine.gguf"
    path.write_bytes(gguf_bytes("qwen3moe"))
    assert _check_under_limit(path) == {"kind": "loaded"}
