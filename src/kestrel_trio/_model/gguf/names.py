"""GGUF tensor names as the Hugging Face checkpoint names the loader checks, and back.

llama.cpp names a decoder's tensors ``token_embd.weight``, ``blk.{i}.attn_q.weight``,
``blk.{i}.ffn_gate_exps.weight`` ...; the loader (kestrel_trio._model.checkpoints.shapes,
kestrel_trio._model.weights.assemble) knows ``model.embed_tokens.weight``,
``model.layers.{i}.self_attn.q_proj.weight``, ... Mapping each GGUF tensor onto
those names lets every shape check apply unchanged; a GGUF MoE layer's three
stacked expert tensors [n_experts, rows, in] become the per-expert names of
the published checkpoints, each one expert of the stacked tensor.

llama.cpp's ``llama`` architecture rotates interleaved pairs (dimension 2i
with 2i+1), where transformers rotates halves (i with i + head_dim/2); its
converter therefore reorders the rows of q_proj and k_proj (weights and
biases) within each head. :func:`hf_row_order` gives the order that undoes it.
The Qwen architectures (``qwen2``, ``qwen3``, ``qwen3moe``) rotate halves in
llama.cpp too, and their rows are stored as transformers holds them.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["GLOBAL_NAMES", "LAYER_NAMES", "EXPERT_NAMES", "EXTRA_TENSORS", "hf_name", "gguf_name",
           "hf_row_order", "PERMUTED_ARCHITECTURES"]

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    **{f"attn_{g}.{kind}": f"self_attn.{h}_proj.{kind}" for g, h in (("q", "q"), ("k", "k"), ("v", "v"),
                                                                   ("output", "o")) for kind in ("weight", "bias")},
    **{f"ffn_{p}.{kind}": f"mlp.{p}_proj.{kind}" for p in ("gate", "up", "down") for kind in ("weight", "bias")},
}
# Stacked experts [n_experts, rows, in]: expert j is checkpoint tensor mlp.experts.{j}.{...}.
EXPERT_NAMES = {f"ffn_{p}_exps.weight": f"{p}_proj.weight" for p in ("gate", "up", "down")}
# Tensors that are not decoder weights: llama3 rope scaling's frequency divisors, read into the config.
EXTRA_TENSORS = ("rope_freqs.weight",)
# Architectures whose q/k rows llama.cpp's converter interleaves.
PERMUTED_ARCHITECTURES = ("llama",)

_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_HF_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(.+)")
_HF_OF_LAYER = {hf: g for g, hf in LAYER_NAMES.items()}
_HF_OF_EXPERT = {hf: g for g, hf in EXPERT_NAMES.items()}
_HF_OF_GLOBAL = {hf: g for g, hf in GLOBAL_NAMES.items()}


def hf_name(name: str, n_experts: int = 0) -> list[tuple[str, int | None]]:
    """The checkpoint names GGUF tensor ``name`` holds, each with its expert index (None: the whole tensor).

    An unknown name maps to nothing (the caller reports it as unexpected).
    """
    if name in GLOBAL_NAMES:
        return [(GLOBAL_NAMES[name], None)]
    match = _BLOCK.fullmatch(name)
    if match is None:
        return []
    layer, rest = match.groups()
    prefix = f"model.layers.{int(layer)}."
    if rest in LAYER_NAMES:
        return [(prefix + LAYER_NAMES[rest], None)]
    if rest in EXPERT_NAMES:
        return [(f"{prefix}mlp.experts.{j}.{EXPERT_NAMES[rest]}", j) for j in range(n_experts)]
    return []


def gguf_name(name: str) -> str:
    """The GGUF tensor that holds checkpoint tensor ``name`` (for messages); ``name`` itself if none does."""
    if name in _HF_OF_GLOBAL:
        return _HF_OF_GLOBAL[name]
    match = _HF_LAYER.fullmatch(name)
    if match is None:
        return name
    layer, rest = match.groups()
    if rest in _HF_OF_LAYER:
        return f"blk.{layer}.{_HF_OF_LAYER[rest]}"
    expert = _HF_EXPERT.fullmatch(rest)
    if expert is not None and expert.group(2) in _HF_OF_EXPERT:
        return f"blk.{layer}.{_HF_OF_EXPERT[expert.group(2)]} (expert {expert.group(1)})"
    return name


def hf_row_order(architecture: str, name: str, n_heads: int, n_kv_heads: int, head_dim: int) -> np.ndarray | None:
    """Row ``r`` of checkpoint tensor ``name`` is row ``order[r]`` of its GGUF tensor; None when unchanged.

    For the ``llama`` architecture's q_proj and k_proj (weight rows and bias
    elements): within each head, the converter stored transformers' row
    ``half * head_dim/2 + i`` at ``2 * i + half``.
    """
    if architecture not in PERMUTED_ARCHITECTURES:
        return None
    if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        heads = n_heads
    elif name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
        heads = n_kv_heads
    else:
        return None
    half = head_dim // 2
    head = np.arange(heads)[:, None, None] * head_dim  # [heads, 1, 1]
    which = np.arange(2)[None, :, None]  # [1, 2, 1]: first or second half
    pair = np.arange(half)[None, None, :] * 2  # [1, 1, half]
    return (head + pair + which).reshape(-1)  # [heads*head_dim]
