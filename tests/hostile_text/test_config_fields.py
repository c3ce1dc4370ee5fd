"""Issue 49 item 8: a config.json or GGUF size or rope field that would divide by zero, take a log of zero or
count billions of layers is a one-line ModelLoadError naming the file and the field (never ZeroDivisionError,
``math domain error`` or a MemoryError); the CLI exits 2 with that line. Files are written by the tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_header_kit import gguf_bytes
from hostile_text_kit import SRC, copy_fixture

from kestrel_trio._model import config_from_dict, config_from_gguf
from kestrel_trio._model.gguf.reader import GgufFile
from kestrel_trio.errors import ModelLoadError
from kestrel_trio.model import load_model

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24, "max_position_embeddings": 64,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}


def _refused(raw: dict) -> str:
    with pytest.raises(ModelLoadError) as refused:
        config_from_dict(raw, source="m/config.json")
    message = refused.value.message
    assert message.startswith("m/config.json: ") and "\n" not in message
    return message


@pytest.mark.parametrize(("change", "field"), [
    ({"num_attention_heads": 0}, "num_attention_heads"),  # hidden // heads: ZeroDivisionError
    ({"num_attention_heads": -4}, "num_attention_heads"),
    ({"hidden_size": 30}, "'hidden_size' (30) is not a multiple of 'num_attention_heads' (4)"),
    ({"hidden_size": -16}, "hidden_size"),
])
def test_a_bad_head_count_or_hidden_size_names_the_field(change: dict, field: str) -> None:
    assert field in _refused({**LLAMA, **change})


@pytest.mark.parametrize(("scaling", "field"), [
    ({**YARN, "factor": 0}, "'factor'"),
    ({**YARN, "factor": -2.0}, "'factor'"),
    ({**YARN, "factor": "4"}, "'factor'"),
    ({**YARN, "factor": float("nan")}, "'factor'"),
    ({**YARN, "original_max_position_embeddings": 0}, "'original_max_position_embeddings'"),
    ({**YARN, "original_max_position_embeddings": "big"}, "'original_max_position_embeddings'"),
    ({**YARN, "original_max_position_embeddings": 1 << 40}, "'original_max_position_embeddings'"),
    ({**YARN, "beta_fast": -1}, "'beta_fast'"),
    ({**YARN, "beta_slow": "slow"}, "'beta_slow'"),
    ({**YARN, "attention_factor": "a"}, "'attention_factor'"),
    ({**YARN, "attention_factor": 0}, "'attention_factor'"),
    ({**YARN, "mscale": "x", "mscale_all_dim": 1}, "'mscale'"),
    ({**YARN, "truncate": "no"}, "'truncate'"),
    ({**YARN, "rope_theta": 1}, "'rope_theta'"),  # yarn divides by log(rope_theta)
    ({k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"},
     "'original_max_position_embeddings'"),
    ({**LLAMA3, "high_freq_factor": 1.0}, "'high_freq_factor'"),  # smoothing divides by high - low
    ({**LLAMA3, "original_max_position_embeddings": -1}, "'original_max_position_embeddings'"),
])
def test_a_bad_rope_scaling_field_is_named(scaling: dict, field: str) -> None:
    raw = {**LLAMA, "rope_scaling": scaling}
    if "rope_theta" in scaling:
        raw["rope_theta"] = scaling["rope_theta"]
    assert field in _refused(raw)


def test_yarn_without_an_original_length_takes_max_position_embeddings() -> None:
    # transformers' rule, kept: only a present but wrong value is refused.
    rope = config_from_dict({**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}).rope
    assert rope.original_max_position_embeddings == LLAMA["max_position_embeddings"] and rope.factor == 2.0


@pytest.mark.parametrize("change", [{"num_attention_heads": 0, "head_dim": None},
                                    {"rope_scaling": {**YARN, "original_max_position_embeddings": 0}},
                                    {"rope_scaling": {**YARN, "factor": 0}}])
def test_the_cli_exits_2_with_one_line_naming_config_json(tmp_path: Path, change: dict) -> None:
    folder = copy_fixture(tmp_path / "m")
    config = {**json.loads((folder / "config.json").read_text()), **change, "architectures": ["LlamaForCausalLM"]}
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    with pytest.raises(ModelLoadError):
        load_model(folder)
    done = subprocess.run([sys.executable, "-m", "kestrel_trio.cli", "generate", "hi", "--model", str(folder)],
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": SRC, "PATH": "/usr/bin"})
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and "config.json" in lines[0] and "Traceback" not in done.stderr, done.stderr[-2000:]


# --- GGUF metadata, raw bytes --------------------------------------------------------------------------------


def _gguf_refused(tmp_path: Path, raw: bytes) -> str:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(raw)
    with pytest.raises(ModelLoadError) as refused:
        config_from_gguf(GgufFile(path))
    message = refused.value.message
    assert message.startswith("hostile.gguf") and "\n" not in message
    return message


@pytest.mark.parametrize(("changes", "key"), [
    ({"attention__head_count": 0}, "llama.attention.head_count"),  # embedding_length // 0
    ({"embedding_length": 0}, "llama.embedding_length"),
    ({"embedding_length": 30}, "llama.embedding_length (30) is not a multiple of llama.attention.head_count"),
    ({"attention__head_count_kv": 3}, "llama.attention.head_count_kv"),
    ({"attention__head_count_kv": 0}, "llama.attention.head_count_kv"),
    ({"block_count": 1 << 31}, "llama.block_count"),
    ({"attention__key_length": 0}, "llama.attention.key_length"),
    ({"rope__scaling__type": "yarn", "rope__scaling__factor": 0.0}, "'factor'"),
    ({"rope__scaling__type": "yarn", "rope__scaling__factor": 4.0, "rope__freq_base": 1.0}, "'rope_theta'"),
])
def test_a_bad_gguf_size_or_rope_key_is_named(tmp_path: Path, changes: dict, key: str) -> None:
    assert key in _gguf_refused(tmp_path, gguf_bytes(**changes))


def test_the_gguf_writer_here_makes_a_loadable_config(tmp_path: Path) -> None:
    path = tmp_path / "fine.gguf"
    path.write_bytes(gguf_bytes("qwen3moe"))
    config = config_from_gguf(GgufFile(path))
    assert config.num_hidden_layers == 2 and config.num_experts == 4 and config.head_dim == 8


@pytest.mark.parametrize(("field", "value"), [("depth", 10**9), ("num_position_embeddings", 1 << 40),
                                              ("hidden_size", 1 << 30), ("num_heads", 1 << 20)])
def test_a_huge_vision_config_size_is_refused_naming_the_field(field: str, value: int) -> None:
    from kestrel_trio._model import vl_config_from_dict

    raw = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_vl" / "config.json").read_text())
    raw["vision_config"] = {**raw["vision_config"], field: value}
    with pytest.raises(ModelLoadError) as refused:
        vl_config_from_dict(raw, source="vl/config.json")
    message = refused.value.message
    assert message.startswith("vl/config.json vision_config: ") and repr(field) in message and "\n" not in message
