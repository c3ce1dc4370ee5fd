"""A :class:`ModelConfig` from a GGUF file's metadata (``{arch}.embedding_length`` ...) and tensor table.

The metadata is translated into the config.json fields it stands for, and
:func:`config_from_dict` then validates them as it does any checkpoint's, so
a GGUF and a Hugging Face folder of the same model give the same config.
What GGUF keeps only in its tensors is read from them: tied embeddings (no
``output.weight``), biases (``blk.0.attn_q.bias`` ...), the MoE layers
(``ffn_gate_inp``), and llama3 rope scaling (``rope_freqs.weight``, the
per-frequency divisors llama.cpp's converter writes instead of the
``rope_scaling`` block). Errors name the file and the GGUF key.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from kestrel_trio._model.checkpoints.config import UPPER_BOUNDS, ModelConfig, config_from_dict
from kestrel_trio._model.forms.dequant import expand_rows
from kestrel_trio._model.gguf.reader import GgufFile
from kestrel_trio.errors import ModelLoadError

__all__ = ["GGUF_ARCHITECTURES", "config_from_gguf", "gguf_architecture"]

# GGUF general.architecture -> the transformers class the loader implements.
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    # Qwen3-VL's language model: a Qwen3 decoder. Text alone rotates as Qwen3 does (its three M-RoPE positions
    # are equal); images need its mmproj file (kestrel_trio._model.vision.qwen3_vl_gguf).
    "qwen3vl": "Qwen3ForCausalLM",
}
# llama.cpp's default when a file names no rope base.
DEFAULT_ROPE_BASE = 10000.0


def gguf_architecture(gguf: GgufFile) -> str:
    """``general.architecture``, checked to be one kestrel-trio serves."""
    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{gguf.path.name}: GGUF metadata has no general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(f"{gguf.path.name}: GGUF architecture {arch!r} is not supported "
                             f"(supported: {', '.join(GGUF_ARCHITECTURES)})")
    return arch


def config_from_gguf(gguf: GgufFile) -> ModelConfig:
    """The decoder configuration of a GGUF file.

    Raises:
        ModelLoadError: naming the file and the missing or invalid key, or an
            unsupported architecture or rope scaling.
    """
    arch = gguf_architecture(gguf)
    keys = _Keys(gguf, arch)
    tensors = gguf.tensors
    # The sizes that are divided by, or that count per-layer work, are bounded first, naming the GGUF key.
    hidden = keys.size("embedding_length", UPPER_BOUNDS["hidden_size"])
    heads = keys.size("attention.head_count", UPPER_BOUNDS["num_attention_heads"])
    layers = keys.size("block_count", UPPER_BOUNDS["num_hidden_layers"])
    if keys.metadata.get(f"{arch}.attention.key_length") is None and hidden % heads:
        raise ModelLoadError(f"{keys.file}: {arch}.embedding_length ({hidden}) is not a multiple of "
                             f"{arch}.attention.head_count ({heads}), and no {arch}.attention.key_length is given")
    head_dim = keys.size("attention.key_length", UPPER_BOUNDS["head_dim"], hidden // heads)
    kv_heads = keys.size("attention.head_count_kv", UPPER_BOUNDS["num_key_value_heads"], heads)
    if heads % kv_heads:
        raise ModelLoadError(f"{keys.file}: {arch}.attention.head_count ({heads}) is not a multiple of "
                             f"{arch}.attention.head_count_kv ({kv_heads})")
    if keys.int("attention.value_length", head_dim) != head_dim:
        raise ModelLoadError(f"{gguf.path.name}: {arch}.attention.value_length differs from key_length "
                             f"({head_dim}); kestrel-trio needs them equal")
    if keys.int("rope.dimension_count", head_dim) != head_dim:
        raise ModelLoadError(f"{gguf.path.name}: {arch}.rope.dimension_count {keys.int('rope.dimension_count')} "
                             f"rotates part of each head of {head_dim}; only whole-head rotary is supported")
    raw: dict[str, Any] = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": keys.int("context_length"),
        "rms_norm_eps": keys.float("attention.layer_norm_rms_epsilon"),
        "vocab_size": keys.int("vocab_size", _vocab_rows(gguf)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "rope_scaling": _rope_scaling(keys),
        "rope_theta": keys.float("rope.freq_base", DEFAULT_ROPE_BASE),
        # Biases are where the tensors say; Qwen2 has q/k/v biases by definition.
        "attention_bias": arch != "qwen2" and "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_gate.bias" in tensors or "blk.0.ffn_down.bias" in tensors,
    }
    if arch == "qwen3moe":
        raw.update(_moe_fields(keys, gguf, raw["num_hidden_layers"]))
    else:
        raw["intermediate_size"] = keys.int("feed_forward_length")
    config = config_from_dict(raw, source=f"{gguf.path.name} (GGUF metadata)")
    factors = _freq_factors(gguf, head_dim)
    if factors is not None:
        config = _with_freq_factors(config, factors)
    return config


def _vocab_rows(gguf: GgufFile) -> int | None:
    embed = gguf.tensors.get("token_embd.weight")
    if embed is not None:
        return embed.shape[0]
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    return len(tokens) if isinstance(tokens, list) else None


def _rope_scaling(keys: "_Keys") -> dict[str, Any] | None:
    kind = keys.str("rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": keys.float("rope.scaling.factor")}
    if kind == "yarn":
        scaling = {"rope_type": "yarn", "factor": keys.float("rope.scaling.factor")}
        original = keys.int("rope.scaling.original_context_length", 0)
        if original:
            scaling["original_max_position_embeddings"] = original
        return scaling
    raise ModelLoadError(f"{keys.file}: {keys.arch}.rope.scaling.type {kind!r} is not supported "
                         f"(supported: none, linear, yarn)")


def _moe_fields(keys: "_Keys", gguf: GgufFile, layers: int) -> dict[str, Any]:
    # Every layer with a router is sparse; llama.cpp's qwen3moe renormalises the top-k weights unless told not to.
    dense = [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in gguf.tensors]
    moe_inter = keys.int("expert_feed_forward_length")
    return {
        "num_experts": keys.int("expert_count"),
        "num_experts_per_tok": keys.int("expert_used_count"),
        "moe_intermediate_size": moe_inter,
        "intermediate_size": keys.int("feed_forward_length", moe_inter),
        "norm_topk_prob": keys.bool("expert_weights_norm", True),
        "decoder_sparse_step": 1,
        "mlp_only_layers": dense,
    }


def _freq_factors(gguf: GgufFile, head_dim: int) -> tuple[float, ...] | None:
    tensor = gguf.tensors.get("rope_freqs.weight")
    if tensor is None:
        return None
    if tensor.shape != (head_dim // 2,):
        raise ModelLoadError(f"{gguf.path.name}: tensor 'rope_freqs.weight' has shape {list(tensor.shape)}, "
                             f"the metadata implies [{head_dim // 2}]")
    values = expand_rows(tensor.ggml_type, gguf.raw_rows(tensor.name)).reshape(-1)  # [head_dim/2]
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ModelLoadError(f"{gguf.path.name}: tensor 'rope_freqs.weight' must hold positive numbers")
    return tuple(float(v) for v in values)


def _with_freq_factors(config: ModelConfig, factors: tuple[float, ...]) -> ModelConfig:
    return attrs.evolve(config, rope=attrs.evolve(config.rope, freq_factors=factors))


class _Keys:
    """Typed access to ``{arch}.{name}`` metadata with errors that name the key."""

    def __init__(self, gguf: GgufFile, arch: str) -> None:
        self.metadata = gguf.metadata
        self.file = gguf.path.name
        self.arch = arch

    def _get(self, name: str) -> tuple[str, Any]:
        key = f"{self.arch}.{name}"
        value = self.metadata.get(key)
        if isinstance(value, np.ndarray):  # a per-layer array: fine when every layer agrees
            if value.size == 0 or not np.all(value == value.flat[0]):
                raise ModelLoadError(f"{self.file}: {key} differs between layers, which is not supported")
            value = value.flat[0].item()
        return key, value

    def int(self, name: str, default: int | None = None) -> int:
        key, value = self._get(name)
        if value is None:
            if default is None:
                raise ModelLoadError(f"{self.file}: GGUF metadata key {key} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelLoadError(f"{self.file}: GGUF metadata {key} must be an integer, got {value!r}")
        return value

    def size(self, name: str, bound: int, default: int | None = None) -> int:
        """An integer key in 1..``bound``: a count or size, checked before anything is divided or allocated by it."""
        value = self.int(name, default)
        if not 1 <= value <= bound:
            raise ModelLoadError(f"{self.file}: GGUF metadata {self.arch}.{name} is {value}, "
                                 f"outside 1..{bound}")
        return value

    def float(self, name: str, default: float | None = None) -> float:
        key, value = self._get(name)
        if value is None:
            if default is None:
                raise ModelLoadError(f"{self.file}: GGUF metadata key {key} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ModelLoadError(f"{self.file}: GGUF metadata {key} must be a number, got {value!r}")
        return float(value)

    def bool(self, name: str, default: bool) -> bool:
        key, value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ModelLoadError(f"{self.file}: GGUF metadata {key} must be a boolean, got {value!r}")
        return value

    def str(self, name: str, default: str) -> str:
        key, value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ModelLoadError(f"{self.file}: GGUF metadata {key} must be a string, got {value!r}")
        return value
