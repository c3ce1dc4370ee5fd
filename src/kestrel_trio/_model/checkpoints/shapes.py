"""The tensors a config implies, by their checkpoint names and shapes, and the check against a checkpoint.

Names are exactly the checkpoint's (``model.layers.{i}.self_attn.q_proj.weight``);
a missing tensor, an unexpected one and a wrong shape are each reported by name,
with the file that holds it, before any data is read.
"""

from __future__ import annotations

from typing import Callable

from kestrel_trio._model.checkpoints.config import ModelConfig
from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint
from kestrel_trio.errors import ModelLoadError

__all__ = ["IGNORED_SUFFIXES", "moe_layout", "expected_shapes", "check_tensors", "check_tensor_set"]

# Buffers some exporters write that carry no learned weights.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def moe_layout(config: ModelConfig, names: set[str], i: int) -> str:
    """'fused' (transformers 5 save format) or 'per_expert' (the published checkpoints)."""
    return "fused" if f"model.layers.{i}.mlp.experts.gate_up_proj" in names else "per_expert"


def expected_shapes(config: ModelConfig, names: set[str] | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor name the config implies, with its shape.

    Args:
        config: the model's configuration.
        names: the tensor names present, used only to tell which of the two MoE
            expert layouts a checkpoint uses.
    """
    c = config
    hd, h, kv = c.head_dim, c.hidden_size, c.num_key_value_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (c.num_attention_heads * hd, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv * hd, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv * hd, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, c.num_attention_heads * hd)
        if c.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (c.num_attention_heads * hd,)
            shapes[p + "self_attn.k_proj.bias"] = (kv * hd,)
            shapes[p + "self_attn.v_proj.bias"] = (kv * hd,)
        if c.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if c.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        if c.is_sparse_layer(i):
            shapes.update(_moe_shapes(c, p, moe_layout(c, names or set(), i)))
        else:
            shapes[p + "mlp.gate_proj.weight"] = (c.intermediate_size, h)
            shapes[p + "mlp.up_proj.weight"] = (c.intermediate_size, h)
            shapes[p + "mlp.down_proj.weight"] = (h, c.intermediate_size)
            if c.mlp_bias:
                shapes[p + "mlp.gate_proj.bias"] = (c.intermediate_size,)
                shapes[p + "mlp.up_proj.bias"] = (c.intermediate_size,)
                shapes[p + "mlp.down_proj.bias"] = (h,)
    return shapes


def _moe_shapes(c: ModelConfig, p: str, layout: str) -> dict[str, tuple[int, ...]]:
    inter, h, e = c.moe_intermediate_size, c.hidden_size, c.num_experts
    shapes = {p + "mlp.gate.weight": (e, h)}
    if layout == "fused":
        shapes[p + "mlp.experts.gate_up_proj"] = (e, 2 * inter, h)
        shapes[p + "mlp.experts.down_proj"] = (e, h, inter)
        return shapes
    for j in range(e):
        shapes[p + f"mlp.experts.{j}.gate_proj.weight"] = (inter, h)
        shapes[p + f"mlp.experts.{j}.up_proj.weight"] = (inter, h)
        shapes[p + f"mlp.experts.{j}.down_proj.weight"] = (h, inter)
    return shapes


def check_tensors(checkpoint: SafetensorsCheckpoint, config: ModelConfig) -> None:
    """Raise ModelLoadError naming the first missing, unexpected or misshapen tensor."""
    present = set(checkpoint.tensors)
    expected = expected_shapes(config, present)
    check_tensor_set(checkpoint, expected, lambda name: _ignorable(name, config), config.architecture)


def check_tensor_set(
    checkpoint: SafetensorsCheckpoint,
    expected: dict[str, tuple[int, ...]],
    ignorable: Callable[[str], bool],
    architecture: str,
) -> None:
    """Every expected tensor present with its shape, nothing else but ``ignorable`` names.

    Raises:
        ModelLoadError: naming the first missing, unexpected or misshapen tensor, and its file.
    """
    present = set(checkpoint.tensors)
    label = getattr(checkpoint, "tensor_label", repr)  # a GGUF names its own tensor first
    source = getattr(checkpoint, "config_source", "config.json")
    missing = sorted(set(expected) - present)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"{checkpoint.folder}: tensor {label(missing[0])} is missing from the checkpoint{more}")
    unexpected = sorted(n for n in present - set(expected) if not ignorable(n))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise ModelLoadError(
            f"{checkpoint.tensors[unexpected[0]].path.name}: unexpected tensor {label(unexpected[0])} "
            f"for {architecture} with this config{more}"
        )
    for name, shape in expected.items():
        got = checkpoint.tensors[name].shape
        if got != shape:
            raise ModelLoadError(
                f"{checkpoint.tensors[name].path.name}: tensor {label(name)} has shape {list(got)}, "
                f"{source} implies {list(shape)}"
            )


def _ignorable(name: str, config: ModelConfig) -> bool:
    # A tied checkpoint may still ship a copy of the embedding as lm_head; it is never read.
    if name == "lm_head.weight" and config.tie_word_embeddings:
        return True
    return name.endswith(IGNORED_SUFFIXES)
