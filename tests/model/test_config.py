"""config.json in both transformers styles reads to the same configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kestrel_trio import ModelLoadError
from kestrel_trio._model.checkpoints.config import config_from_dict
from kestrel_trio._model.decoder.rope import Rope

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

V4 = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "rope_theta": 1000000, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    "torch_dtype": "bfloat16", "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28,
}
V5 = {
    **{k: v for k, v in V4.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")},
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000, "factor": 4.0, "original_max_position_embeddings": 32768},
    "dtype": "bfloat16", "layer_types": ["full_attention"] * 28,
}


def test_both_styles_read_alike():
    assert config_from_dict(V4) == config_from_dict(V5)
    config = config_from_dict(V4)
    assert config.rope.rope_type == "yarn" and config.rope.rope_theta == 1e6 and config.torch_dtype == "bfloat16"
    assert config.head_dim == 128 and config.hidden_size // config.num_attention_heads == 64


def test_yarn_scales_cos_and_sin_and_slows_low_frequencies():
    plain = Rope.build(config_from_dict({**V4, "rope_scaling": None}).rope, 128)
    yarn = Rope.build(config_from_dict(V4).rope, 128)
    assert plain.attention_scaling == 1.0
    assert yarn.attention_scaling == pytest.approx(0.1 * __import__("math").log(4.0) + 1.0)
    assert yarn.inv_freq[0] == plain.inv_freq[0]  # high frequencies extrapolate
    assert yarn.inv_freq[-1] == pytest.approx(plain.inv_freq[-1] / 4.0)  # low frequencies interpolate


def test_transformers5_moe_alias_num_local_experts():
    raw = json.loads((FIXTURES / "qwen3_moe_nonorm" / "config.json").read_text())
    assert "num_experts" not in raw
    assert config_from_dict(raw).num_experts == raw["num_local_experts"]


def test_sliding_window_models_are_refused_by_name():
    with pytest.raises(ModelLoadError, match="use_sliding_window"):
        config_from_dict({**V4, "use_sliding_window": True})
    with pytest.raises(ModelLoadError, match="sliding_attention"):
        config_from_dict({**V5, "layer_types": ["sliding_attention"] * 28})


def test_heads_must_divide_into_kv_groups():
    with pytest.raises(ModelLoadError, match="num_key_value_heads"):
        config_from_dict({**V4, "num_key_value_heads": 5})


def test_qwen2_has_qkv_bias_and_no_qk_norm():
    config = config_from_dict({**V4, "architectures": ["Qwen2ForCausalLM"], "head_dim": None})
    assert config.qkv_bias and not config.o_bias and not config.qk_norm
    assert config.head_dim == 64


@pytest.mark.parametrize(("field", "value"), [("num_hidden_layers", 10**9), ("hidden_size", 1 << 31),
                                              ("vocab_size", 1 << 40), ("max_position_embeddings", 1 << 62),
                                              ("num_attention_heads", 1 << 20), ("intermediate_size", 1 << 33)])
def test_a_size_field_past_its_bound_is_refused_naming_it(field, value):
    raw = {**V4, field: value}
    if field == "num_attention_heads":
        raw["num_key_value_heads"] = value
    with pytest.raises(ModelLoadError) as refused:
        config_from_dict(raw, source="hostile/config.json")
    assert refused.value.message.startswith("hostile/config.json: ") and repr(field) in refused.value.message
