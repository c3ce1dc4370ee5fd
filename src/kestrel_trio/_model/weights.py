"""Weights of a Qwen decoder, loaded by their checkpoint names and checked.

The loader first lists every tensor the config implies, with its shape, under
the exact names the checkpoint uses (``model.layers.{i}.self_attn.q_proj.weight``),
then compares that list with the files: a missing tensor, an unexpected one and
a wrong shape are each reported by name before any data is read. All arrays
are float32 and read-only: weights are shared by every request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import attrs
import numpy as np

from kestrel_trio._model.config import ModelConfig
from kestrel_trio._model.safetensors import SafetensorsCheckpoint
from kestrel_trio.errors import ModelLoadError

__all__ = ["Attention", "DenseMLP", "SparseMoE", "Layer", "Weights", "expected_shapes", "check_tensors", "load_weights", "assemble_weights"]

# Buffers some exporters write that carry no learned weights.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@attrs.frozen
class Attention:
    q_proj: np.ndarray  # [n_heads*head_dim, hidden]
    k_proj: np.ndarray  # [n_kv*head_dim, hidden]
    v_proj: np.ndarray  # [n_kv*head_dim, hidden]
    o_proj: np.ndarray  # [hidden, n_heads*head_dim]
    q_bias: np.ndarray | None  # [n_heads*head_dim]
    k_bias: np.ndarray | None  # [n_kv*head_dim]
    v_bias: np.ndarray | None  # [n_kv*head_dim]
    o_bias: np.ndarray | None  # [hidden]
    q_norm: np.ndarray | None  # [head_dim]
    k_norm: np.ndarray | None  # [head_dim]


@attrs.frozen
class DenseMLP:
    gate_proj: np.ndarray  # [inter, hidden]
    up_proj: np.ndarray  # [inter, hidden]
    down_proj: np.ndarray  # [hidden, inter]


@attrs.frozen
class SparseMoE:
    router: np.ndarray  # [n_experts, hidden]
    experts: tuple[DenseMLP, ...]  # n_experts of [moe_inter, hidden] / [hidden, moe_inter]


@attrs.frozen
class Layer:
    input_layernorm: np.ndarray  # [hidden]
    attn: Attention
    post_attention_layernorm: np.ndarray  # [hidden]
    mlp: DenseMLP | SparseMoE


@attrs.frozen
class Weights:
    embed_tokens: np.ndarray  # [vocab, hidden]
    layers: tuple[Layer, ...]
    norm: np.ndarray  # [hidden]
    lm_head: np.ndarray  # [vocab, hidden] (embed_tokens itself when tied)


def _moe_layout(config: ModelConfig, names: set[str], i: int) -> str:
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
            shapes.update(_moe_shapes(c, p, _moe_layout(c, names or set(), i)))
        else:
            shapes[p + "mlp.gate_proj.weight"] = (c.intermediate_size, h)
            shapes[p + "mlp.up_proj.weight"] = (c.intermediate_size, h)
            shapes[p + "mlp.down_proj.weight"] = (h, c.intermediate_size)
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
    missing = sorted(set(expected) - present)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"{checkpoint.folder}: tensor {missing[0]!r} is missing from the checkpoint{more}")
    unexpected = sorted(n for n in present - set(expected) if not _ignorable(n, config))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise ModelLoadError(
            f"{checkpoint.tensors[unexpected[0]].path.name}: unexpected tensor {unexpected[0]!r} "
            f"for {config.architecture} with this config{more}"
        )
    for name, shape in expected.items():
        got = checkpoint.tensors[name].shape
        if got != shape:
            raise ModelLoadError(
                f"{checkpoint.tensors[name].path.name}: tensor {name!r} has shape {list(got)}, "
                f"config.json implies {list(shape)}"
            )


def _ignorable(name: str, config: ModelConfig) -> bool:
    # A tied checkpoint may still ship a copy of the embedding as lm_head; it is never read.
    if name == "lm_head.weight" and config.tie_word_embeddings:
        return True
    return name.endswith(_IGNORED_SUFFIXES)


def load_weights(folder: Path, config: ModelConfig, progress: Callable[[float], None] | None = None) -> Weights:
    """Check and load every tensor of the checkpoint in ``folder`` as float32.

    Args:
        folder: the checkpoint folder.
        config: its configuration.
        progress: called with the fraction of bytes read so far (0 to 1).

    Raises:
        ModelLoadError: naming the file or tensor at fault.
    """
    checkpoint = SafetensorsCheckpoint(folder)
    check_tensors(checkpoint, config)
    read = checkpoint.read
    if progress is not None:
        total = sum(info.nbytes for info in checkpoint.tensors.values()) or 1
        done = 0

        def read(name: str) -> np.ndarray:
            nonlocal done
            array = checkpoint.read(name)
            done += checkpoint.tensors[name].nbytes
            progress(min(1.0, done / total))
            return array

    return assemble_weights(config, read, set(checkpoint.tensors))


def assemble_weights(config: ModelConfig, read: Callable[[str], np.ndarray], names: set[str]) -> Weights:
    """Build :class:`Weights` from checked tensors.

    Args:
        config: the model's configuration.
        read: returns the float32 tensor of a checkpoint name.
        names: every tensor name present (tells the MoE expert layout).
    """
    embed = read("model.embed_tokens.weight")  # [vocab, hidden]
    layers = tuple(_load_layer(read, config, i, names) for i in range(config.num_hidden_layers))
    return Weights(
        embed_tokens=embed,
        layers=layers,
        norm=read("model.norm.weight"),  # [hidden]
        lm_head=embed if config.tie_word_embeddings else read("lm_head.weight"),  # [vocab, hidden]
    )


def _load_layer(read, config: ModelConfig, i: int, names: set[str]) -> Layer:
    p = f"model.layers.{i}."
    a = p + "self_attn."

    def optional(name: str, present: bool) -> np.ndarray | None:
        return read(name) if present else None

    attn = Attention(
        q_proj=read(a + "q_proj.weight"),  # [n_heads*head_dim, hidden]
        k_proj=read(a + "k_proj.weight"),  # [n_kv*head_dim, hidden]
        v_proj=read(a + "v_proj.weight"),  # [n_kv*head_dim, hidden]
        o_proj=read(a + "o_proj.weight"),  # [hidden, n_heads*head_dim]
        q_bias=optional(a + "q_proj.bias", config.qkv_bias),  # [n_heads*head_dim]
        k_bias=optional(a + "k_proj.bias", config.qkv_bias),  # [n_kv*head_dim]
        v_bias=optional(a + "v_proj.bias", config.qkv_bias),  # [n_kv*head_dim]
        o_bias=optional(a + "o_proj.bias", config.o_bias),  # [hidden]
        q_norm=optional(a + "q_norm.weight", config.qk_norm),  # [head_dim]
        k_norm=optional(a + "k_norm.weight", config.qk_norm),  # [head_dim]
    )
    mlp: DenseMLP | SparseMoE
    if config.is_sparse_layer(i):
        mlp = _load_moe(read, config, p, _moe_layout(config, names, i))
    else:
        mlp = DenseMLP(
            gate_proj=read(p + "mlp.gate_proj.weight"),  # [inter, hidden]
            up_proj=read(p + "mlp.up_proj.weight"),  # [inter, hidden]
            down_proj=read(p + "mlp.down_proj.weight"),  # [hidden, inter]
        )
    return Layer(
        input_layernorm=read(p + "input_layernorm.weight"),  # [hidden]
        attn=attn,
        post_attention_layernorm=read(p + "post_attention_layernorm.weight"),  # [hidden]
        mlp=mlp,
    )


def _load_moe(read, config: ModelConfig, p: str, layout: str) -> SparseMoE:
    inter = config.moe_intermediate_size
    router = read(p + "mlp.gate.weight")  # [n_experts, hidden]
    if layout == "fused":
        gate_up = read(p + "mlp.experts.gate_up_proj")  # [n_experts, 2*moe_inter, hidden]
        down = read(p + "mlp.experts.down_proj")  # [n_experts, hidden, moe_inter]
        experts = tuple(
            DenseMLP(gate_proj=gate_up[j, :inter], up_proj=gate_up[j, inter:], down_proj=down[j])
            for j in range(config.num_experts)
        )
    else:
        e = p + "mlp.experts."
        experts = tuple(
            DenseMLP(
                gate_proj=read(f"{e}{j}.gate_proj.weight"),  # [moe_inter, hidden]
                up_proj=read(f"{e}{j}.up_proj.weight"),  # [moe_inter, hidden]
                down_proj=read(f"{e}{j}.down_proj.weight"),  # [hidden, moe_inter]
            )
            for j in range(config.num_experts)
        )
    return SparseMoE(router=router, experts=experts)
