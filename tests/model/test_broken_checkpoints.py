"""Every kind of broken checkpoint raises ModelLoadError naming the culprit."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from kestrel_trio import KestrelError, ModelLoadError, load_model
from kestrel_trio._model.checkpoints.random_init import random_tensors, write_random_checkpoint
from kestrel_trio._model.checkpoints.config import config_from_dict
from kestrel_trio._model.checkpoints.safetensors import save_safetensors

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 24,
    "max_position_embeddings": 64, "tie_word_embeddings": False,
}


def _write(folder: Path, tensors, config=CONFIG):
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_safetensors(folder / "model.safetensors", tensors)


def _tensors(config=CONFIG):
    return random_tensors(config_from_dict(config), seed=1)


def _load_error(folder) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(folder)
    assert isinstance(info.value, KestrelError)
    return str(info.value)


def test_a_good_checkpoint_loads(tmp_path):
    _write(tmp_path, _tensors())
    assert load_model(tmp_path).config.num_hidden_layers == 2


def test_missing_tensor_is_named(tmp_path):
    tensors = _tensors()
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    _write(tmp_path, tensors)
    assert "'model.layers.1.self_attn.k_norm.weight' is missing" in _load_error(tmp_path)


def test_unexpected_tensor_is_named(tmp_path):
    tensors = _tensors()
    tensors["model.layers.0.self_attn.q_proj.bias"] = tensors["model.layers.0.self_attn.q_norm.weight"]
    _write(tmp_path, tensors)
    message = _load_error(tmp_path)
    assert "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'" in message
    assert "model.safetensors" in message


def test_wrong_shape_is_named_with_both_shapes(tmp_path):
    tensors = _tensors()
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"][:20]
    _write(tmp_path, tensors)
    message = _load_error(tmp_path)
    assert "'model.layers.0.mlp.up_proj.weight' has shape [20, 16]" in message and "[24, 16]" in message


def test_truncated_file_is_named(tmp_path):
    _write(tmp_path, _tensors())
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    message = _load_error(tmp_path)
    assert "model.safetensors" in message and "truncated" in message


def test_file_shorter_than_its_header_is_named(tmp_path):
    _write(tmp_path, _tensors())
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:40])
    assert "model.safetensors: truncated or corrupt safetensors header" in _load_error(tmp_path)


def test_corrupt_header_json_is_named(tmp_path):
    _write(tmp_path, _tensors())
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"{nope")
    assert "model.safetensors: safetensors header is not valid JSON" in _load_error(tmp_path)


def test_unsupported_dtype_is_named(tmp_path):
    _write(tmp_path, _tensors())
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    assert "'model.embed_tokens.weight' has dtype I8" in _load_error(tmp_path)


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size"])
def test_missing_config_field_is_named(tmp_path, field):
    config = dict(CONFIG)
    del config[field]
    _write(tmp_path, {}, config)
    assert f"required field {field!r} is missing" in _load_error(tmp_path)


def test_config_field_of_wrong_type_is_named(tmp_path):
    _write(tmp_path, {}, {**CONFIG, "num_attention_heads": "four"})
    assert "field 'num_attention_heads' must be an integer" in _load_error(tmp_path)


def test_unsupported_architecture_is_named(tmp_path):
    _write(tmp_path, {}, {**CONFIG, "architectures": ["MistralForCausalLM"]})
    assert "architecture 'MistralForCausalLM' is not supported" in _load_error(tmp_path)


def test_unsupported_rope_type_is_named(tmp_path):
    _write(tmp_path, {}, {**CONFIG, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    assert "rope_type 'dynamic' is not supported" in _load_error(tmp_path)


def test_missing_config_json(tmp_path):
    assert "no config.json" in _load_error(tmp_path)


def test_invalid_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{,")
    assert "cannot read config.json" in _load_error(tmp_path)


def test_no_weights_at_all(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert "no model.safetensors" in _load_error(tmp_path)


def test_not_a_folder(tmp_path):
    assert "not a checkpoint folder" in _load_error(tmp_path / "absent")


def test_index_naming_a_missing_shard(tmp_path):
    write_random_checkpoint(tmp_path, CONFIG, shards=2)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    assert "names shard 'model-00002-of-00002.safetensors'" in _load_error(tmp_path)


def test_index_placing_a_tensor_in_the_wrong_shard(tmp_path):
    write_random_checkpoint(tmp_path, CONFIG, shards=2)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = "model.embed_tokens.weight"
    index["weight_map"][name] = "model-00002-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    assert f"places tensor {name!r} in model-00002-of-00002.safetensors" in _load_error(tmp_path)


def test_tied_checkpoint_has_no_lm_head_and_shares_the_embedding(tmp_path):
    config = {**CONFIG, "tie_word_embeddings": True}
    tensors = _tensors(config)
    assert "lm_head.weight" not in tensors
    _write(tmp_path, tensors, config)
    weights = load_model(tmp_path).decoder.weights
    assert weights.lm_head is weights.embed_tokens


def test_untied_checkpoint_without_lm_head_is_an_error(tmp_path):
    tensors = _tensors()
    del tensors["lm_head.weight"]
    _write(tmp_path, tensors)
    assert "'lm_head.weight' is missing" in _load_error(tmp_path)


def test_weights_are_read_only(tmp_path):
    _write(tmp_path, _tensors())
    weights = load_model(tmp_path).decoder.weights
    with pytest.raises(ValueError):
        weights.embed_tokens[0, 0] = 1.0


def test_fixture_copy_with_a_dropped_shard_entry(tmp_path):
    source = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_sharded"
    target = tmp_path / "ckpt"
    shutil.copytree(source, target)
    shard = sorted(target.glob("model-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-7])
    message = _load_error(target)
    assert shard.name in message and "truncated" in message


LLAMA = {**CONFIG, "architectures": ["LlamaForCausalLM"], "mlp_bias": True}


def test_llama_mlp_bias_tensors_are_required_and_named(tmp_path):
    tensors = _tensors(LLAMA)
    assert "model.layers.0.mlp.up_proj.bias" in tensors and "model.layers.0.self_attn.q_norm.weight" not in tensors
    del tensors["model.layers.1.mlp.down_proj.bias"]
    _write(tmp_path, tensors, LLAMA)
    assert "tensor 'model.layers.1.mlp.down_proj.bias' is missing" in _load_error(tmp_path)


def test_llama3_rope_scaling_needs_its_factors(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    _write(tmp_path, {}, {**LLAMA, "rope_scaling": scaling})
    assert "rope scaling field 'low_freq_factor' must be a positive number, got None" in _load_error(tmp_path)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors",
                                   "link.safetensors"])
def test_an_index_naming_a_shard_outside_the_folder_is_refused(tmp_path, shard):
    from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint

    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside.safetensors").write_bytes(b"\0" * 16)
    (folder / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(ModelLoadError) as refused:
        SafetensorsCheckpoint(folder)
    message = refused.value.message
    assert message.startswith("model.safetensors.index.json: ") and "\n" not in message
