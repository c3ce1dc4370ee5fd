"""Random tiny configs, written to disk, load through the real loader and decode consistently."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kestrel_trio import load_model
from kestrel_trio._model.checkpoints.random_init import write_random_checkpoint


@st.composite
def tiny_configs(draw):
    kv = draw(st.integers(1, 3))
    heads = kv * draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([4, 8, 16]))
    arch = draw(st.sampled_from(["Qwen3ForCausalLM", "Qwen2ForCausalLM", "Qwen3MoeForCausalLM"]))
    layers = draw(st.integers(1, 3))
    config = {
        "architectures": [arch],
        "vocab_size": draw(st.integers(16, 96)),
        "hidden_size": draw(st.sampled_from([8, 16, 24])),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": draw(st.integers(4, 40)),
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": draw(st.booleans()),
        "rope_theta": draw(st.sampled_from([10000.0, 1000000.0])),
    }
    if arch == "Qwen3MoeForCausalLM":
        experts = draw(st.integers(2, 6))
        config.update(
            num_experts=experts,
            num_experts_per_tok=draw(st.integers(1, experts)),
            moe_intermediate_size=draw(st.integers(2, 12)),
            norm_topk_prob=draw(st.booleans()),
            decoder_sparse_step=draw(st.integers(1, 2)),
            mlp_only_layers=draw(st.lists(st.integers(0, layers - 1), unique=True, max_size=1)),
        )
    if draw(st.booleans()):
        config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    return config


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=tiny_configs(), seed=st.integers(0, 2**16), dtype=st.sampled_from(["F32", "BF16", "F16"]),
       length=st.integers(2, 30), data=st.data())
def test_prefill_plus_decode_equals_full_forward(config, seed, dtype, length, data):
    with tempfile.TemporaryDirectory() as tmp:
        write_random_checkpoint(Path(tmp), config, seed=seed, dtype=dtype, shards=data.draw(st.integers(1, 3)))
        model = load_model(tmp)
        ids = np.random.default_rng(seed).integers(0, config["vocab_size"], size=length).tolist()
        full = model.logits(ids)
        split = data.draw(st.integers(1, length - 1))
        cache = model.new_cache()
        prefill = model.step(cache, ids[:split], all_logits=True)
        decode = [model.step(cache, [t], all_logits=True) for t in ids[split:]]
    stepped = np.concatenate([prefill, *decode])
    assert stepped.shape == (length, config["vocab_size"])
    assert np.isfinite(stepped).all()
    np.testing.assert_allclose(stepped, full, rtol=0, atol=1e-5 * max(1.0, float(np.abs(full).max())))


def test_random_checkpoint_round_trips_exactly_in_fp32(tmp_path):
    config = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 12,
              "max_position_embeddings": 64}
    tensors = write_random_checkpoint(tmp_path, config, seed=3)
    model = load_model(tmp_path)
    np.testing.assert_array_equal(model.decoder.weights.embed_tokens, tensors["model.embed_tokens.weight"])
    np.testing.assert_array_equal(model.decoder.weights.layers[0].attn.k_norm, tensors["model.layers.0.self_attn.k_norm.weight"])
