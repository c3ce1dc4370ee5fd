"""Model configuration read from a checkpoint's config.json.

Field names are those of the file. Both config styles found in the wild are
read: transformers 4 (``rope_theta``, ``rope_scaling``, ``torch_dtype``) and
transformers 5 (``rope_parameters``, ``dtype``, ``layer_types``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs

from kestrel_trio._model.checkpoints.confine import check_folder_files, confined
from kestrel_trio.errors import ModelLoadError

__all__ = ["SUPPORTED_ARCHITECTURES", "RopeConfig", "ModelConfig", "read_config", "config_from_dict"]

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "Qwen3MoeForCausalLM", "LlamaForCausalLM")
# The families that RMS-normalise each query and key head before RoPE.
QK_NORM_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@attrs.frozen
class RopeConfig:
    """Rotary position embedding settings.

    Attributes:
        rope_type: one of ROPE_TYPES: "default", "linear" (frequencies divided
            by ``factor``), "llama3" (Llama 3.1's per-wavelength scaling) or "yarn".
        rope_theta: the base wavelength.
        factor: the context extension factor (linear, llama3, yarn).
        original_max_position_embeddings: the pretraining context length (tokens; llama3, yarn).
        beta_fast: yarn's extrapolation boundary.
        beta_slow: yarn's interpolation boundary.
        attention_factor: yarn's cos/sin scale (None: derived from factor).
        truncate: yarn's correction-range rounding.
        low_freq_factor: llama3's long-wavelength boundary (original context / this).
        high_freq_factor: llama3's short-wavelength boundary.
        freq_factors: per-frequency divisors of the inverse frequencies
            [head_dim/2] (a GGUF's ``rope_freqs.weight``, how llama.cpp's
            converter stores llama3 scaling), or None.
    """

    rope_type: str = "default"
    rope_theta: float = 10000.0
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    freq_factors: tuple[float, ...] | None = None


@attrs.frozen
class ModelConfig:
    """The fields of config.json that the forward pass needs, named as in the file."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope: RopeConfig
    torch_dtype: str | None = None
    # Llama only: gate/up/down projections carry biases.
    mlp_bias: bool = False
    # Qwen3-MoE only
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    @property
    def qk_norm(self) -> bool:
        """Whether q_norm/k_norm are applied per head before RoPE (Qwen3 families)."""
        return self.architecture in QK_NORM_ARCHITECTURES

    @property
    def qkv_bias(self) -> bool:
        """Whether q/k/v projections carry a bias (always for Qwen2)."""
        return self.architecture == "Qwen2ForCausalLM" or self.attention_bias

    @property
    def o_bias(self) -> bool:
        """Whether o_proj carries a bias (Qwen3's and Llama's attention_bias applies to all four)."""
        return self.architecture != "Qwen2ForCausalLM" and self.attention_bias

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether decoder layer ``layer_idx`` uses the mixture-of-experts MLP."""
        return (
            self.architecture == "Qwen3MoeForCausalLM"
            and self.num_experts > 0
            and layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )


def read_config(folder: Path) -> ModelConfig:
    """Read and validate ``folder/config.json``.

    Raises:
        ModelLoadError: the file is missing or unreadable, a field is missing or
            of the wrong type, or the architecture is not supported.
    """
    raw, path = read_config_json(folder)
    return config_from_dict(raw, source=str(path))


def read_config_json(folder: str | Path) -> tuple[dict[str, Any], Path]:
    """The parsed ``folder/config.json`` object and its path.

    Raises:
        ModelLoadError: the file is missing, unreadable, not JSON or not an object.
    """
    check_folder_files(Path(folder))  # every file a folder names, before any is read
    path = Path(folder) / "config.json"
    return read_json_object(path, "no config.json in the checkpoint folder"), path


def read_json_object(path: Path, missing: str) -> dict[str, Any]:
    """The JSON object in ``path``.

    Raises:
        ModelLoadError: ``{path}: {missing}`` when absent; else naming what is wrong with the file, or
            that it resolves outside its folder (a symlink out).
    """
    confined(path.parent, path.name)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: {missing}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: cannot read {path.name}: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path}: {path.name} is not a JSON object")
    return raw


def config_from_dict(raw: dict[str, Any], *, source: str = "config.json") -> ModelConfig:
    """Build a :class:`ModelConfig` from the parsed config.json dict."""
    fields = _Fields(raw, source)
    architecture = _architecture(raw, source)
    heads = fields.positive_int("num_attention_heads")
    hidden = fields.positive_int("hidden_size")
    is_moe = architecture == "Qwen3MoeForCausalLM"
    # transformers' own defaults when head_dim is absent: 128 for Qwen3 dense, hidden/heads otherwise.
    default_head_dim = 128 if architecture == "Qwen3ForCausalLM" else hidden // heads
    if raw.get("head_dim") is None and architecture != "Qwen3ForCausalLM" and hidden % heads:
        raise ModelLoadError(f"{source}: field 'hidden_size' ({hidden}) is not a multiple of "
                             f"'num_attention_heads' ({heads}), and no 'head_dim' is given")
    _reject_unsupported_attention(raw, fields, source)
    is_llama = architecture == "LlamaForCausalLM"
    if fields.get("hidden_act", str, "silu") != "silu":
        raise ModelLoadError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported (only 'silu')")
    config = ModelConfig(
        architecture=architecture,
        vocab_size=fields.int("vocab_size"),
        hidden_size=hidden,
        num_hidden_layers=fields.int("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=fields.int("num_key_value_heads", heads),
        head_dim=fields.int("head_dim", default_head_dim),
        intermediate_size=fields.int("intermediate_size"),
        rms_norm_eps=fields.float("rms_norm_eps", 1e-6),
        max_position_embeddings=fields.int("max_position_embeddings"),
        tie_word_embeddings=fields.get("tie_word_embeddings", bool, False),
        attention_bias=fields.get("attention_bias", bool, False),
        rope=_rope(raw, fields, source),
        torch_dtype=fields.get("torch_dtype", str, None) or fields.get("dtype", str, None),
        mlp_bias=fields.get("mlp_bias", bool, False) if is_llama else False,
        # transformers 5 writes num_experts under its alias num_local_experts.
        num_experts=fields.int(fields.alias("num_experts", "num_local_experts")) if is_moe else 0,
        num_experts_per_tok=fields.int("num_experts_per_tok") if is_moe else 0,
        moe_intermediate_size=fields.int("moe_intermediate_size") if is_moe else 0,
        norm_topk_prob=fields.get("norm_topk_prob", bool, False) if is_moe else False,
        decoder_sparse_step=fields.int("decoder_sparse_step", 1) if is_moe else 1,
        mlp_only_layers=tuple(fields.get("mlp_only_layers", list, None) or ()) if is_moe else (),
    )
    _validate(config, source)
    return config


# Upper bounds on size fields, checked before anything is allocated from them: far above any real model (the
# largest open models have ~200 layers, 16k hidden, 256k vocabulary, 1M context), far below what would let a
# 1 KiB file ask for gigabytes of per-layer objects or an overflowing product.
UPPER_BOUNDS = {"vocab_size": 1 << 22, "hidden_size": 1 << 16, "num_hidden_layers": 4096,
                 "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 1024,
                 "intermediate_size": 1 << 20, "max_position_embeddings": 1 << 24, "num_experts": 4096,
                 "moe_intermediate_size": 1 << 20}


def _validate(config: ModelConfig, source: str) -> None:
    positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings")
    for name in positive:
        if getattr(config, name) < 1:
            raise ModelLoadError(f"{source}: field {name!r} must be >= 1, got {getattr(config, name)}")
    for name, bound in UPPER_BOUNDS.items():
        value = getattr(config, name, 0)
        if isinstance(value, int) and value > bound:
            raise ModelLoadError(f"{source}: field {name!r} is {value}, above the most kestrel-trio accepts ({bound})")
    if config.num_attention_heads % config.num_key_value_heads:
        raise ModelLoadError(
            f"{source}: num_attention_heads ({config.num_attention_heads}) is not a multiple of "
            f"num_key_value_heads ({config.num_key_value_heads})"
        )
    if config.head_dim % 2:
        raise ModelLoadError(f"{source}: field 'head_dim' must be even for rotary embeddings, got {config.head_dim}")
    if config.architecture == "Qwen3MoeForCausalLM":
        if not 1 <= config.num_experts_per_tok <= config.num_experts:
            raise ModelLoadError(
                f"{source}: num_experts_per_tok ({config.num_experts_per_tok}) must be in 1..num_experts "
                f"({config.num_experts})"
            )
        if config.moe_intermediate_size < 1 or config.decoder_sparse_step < 1:
            raise ModelLoadError(f"{source}: moe_intermediate_size and decoder_sparse_step must be >= 1")
        bad = [i for i in config.mlp_only_layers if not isinstance(i, int) or not 0 <= i < config.num_hidden_layers]
        if bad:
            raise ModelLoadError(f"{source}: mlp_only_layers has layer indices out of range: {bad}")


def _architecture(raw: dict[str, Any], source: str) -> str:
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise ModelLoadError(f"{source}: field 'architectures' is missing or not a list of names")
    for arch in archs:
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"{source}: architecture {arch!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
    return archs[0]


def _reject_unsupported_attention(raw: dict[str, Any], fields: "_Fields", source: str) -> None:
    if fields.get("use_sliding_window", bool, False):
        raise ModelLoadError(f"{source}: use_sliding_window=true is not supported")
    layer_types = raw.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list):
            raise ModelLoadError(f"{source}: field 'layer_types' must be a list")
        odd = sorted({t for t in layer_types if t != "full_attention"}, key=str)
        if odd:
            raise ModelLoadError(f"{source}: layer_types {odd} are not supported (only 'full_attention')")


def _rope(raw: dict[str, Any], fields: "_Fields", source: str) -> RopeConfig:
    # transformers 5: rope_parameters holds everything; transformers 4: rope_theta + rope_scaling.
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    merged: dict[str, Any] = {}
    for name, block in (("rope_scaling", scaling), ("rope_parameters", params)):
        if block is None:
            continue
        if not isinstance(block, dict):
            raise ModelLoadError(f"{source}: field {name!r} must be an object or null")
        merged.update(block)
    theta = merged.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise ModelLoadError(f"{source}: field 'rope_theta' must be a positive number, got {theta!r}")
    if rope_type == "default":
        return RopeConfig(rope_theta=float(theta))
    if rope_type not in ROPE_TYPES:
        raise ModelLoadError(f"{source}: rope_type {rope_type!r} is not supported "
                             f"(supported: {', '.join(map(repr, ROPE_TYPES))})")
    if rope_type == "linear":
        return RopeConfig(rope_type="linear", rope_theta=float(theta), factor=_rope_number(merged, "factor", source))
    if "original_max_position_embeddings" not in merged and "original_max_position_embeddings" in raw:
        merged["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
    if rope_type == "llama3":
        low, high = _rope_number(merged, "low_freq_factor", source), _rope_number(merged, "high_freq_factor", source)
        if high <= low:  # the smoothing divides by high - low
            raise ModelLoadError(f"{source}: rope scaling field 'high_freq_factor' ({high}) must exceed "
                                 f"'low_freq_factor' ({low})")
        return RopeConfig(
            rope_type="llama3", rope_theta=float(theta), factor=_rope_number(merged, "factor", source),
            original_max_position_embeddings=_rope_length(merged, source), low_freq_factor=low, high_freq_factor=high,
        )
    # yarn: transformers takes the pretraining context from max_position_embeddings when the block names none.
    if merged.get("original_max_position_embeddings") is None:
        merged["original_max_position_embeddings"] = fields.positive_int("max_position_embeddings")
    original = _rope_length(merged, source)
    if theta <= 1:  # yarn's correction range divides by log(rope_theta)
        raise ModelLoadError(f"{source}: field 'rope_theta' must exceed 1 for yarn rope scaling, got {theta!r}")
    if merged.get("factor") is None:
        merged["factor"] = fields.positive_int("max_position_embeddings") / original
    optional = {name: None if merged.get(name) is None
                else _rope_number(merged, name, source, finite_only=name != "attention_factor")
                for name in ("attention_factor", "mscale", "mscale_all_dim")}
    truncate = merged.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ModelLoadError(f"{source}: rope scaling field 'truncate' must be true or false, got {truncate!r}")
    return RopeConfig(
        rope_type="yarn",
        rope_theta=float(theta),
        factor=_rope_number(merged, "factor", source),
        original_max_position_embeddings=original,
        beta_fast=32.0 if merged.get("beta_fast") is None else _rope_number(merged, "beta_fast", source),
        beta_slow=1.0 if merged.get("beta_slow") is None else _rope_number(merged, "beta_slow", source),
        attention_factor=optional["attention_factor"],
        mscale=optional["mscale"],
        mscale_all_dim=optional["mscale_all_dim"],
        truncate=truncate,
    )


def _rope_number(block: dict[str, Any], name: str, source: str, *, finite_only: bool = False) -> float:
    """A required positive (``finite_only``: any finite) number of the rope scaling block."""
    value = block.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (value <= 0 and not finite_only):
        kind = "a number" if finite_only else "a positive number"
        raise ModelLoadError(f"{source}: rope scaling field {name!r} must be {kind}, got {value!r}")
    return float(value)


def _rope_length(block: dict[str, Any], source: str) -> int:
    """The rope scaling block's ``original_max_position_embeddings``: a required positive integer (tokens)."""
    value = block.get("original_max_position_embeddings")
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # some exporters write 32768.0
    bound = UPPER_BOUNDS["max_position_embeddings"]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
        raise ModelLoadError(f"{source}: rope scaling field 'original_max_position_embeddings' must be a positive "
                             f"number of tokens, got {value!r}")
    return value


class _Fields:
    """Typed access to config.json fields with errors that name the field."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source

    def get(self, name: str, kind: type, default: Any) -> Any:
        value = self.raw.get(name)
        if value is None:
            return default
        if not isinstance(value, kind):
            raise ModelLoadError(f"{self.source}: field {name!r} must be {kind.__name__}, got {value!r}")
        return value

    def alias(self, name: str, alias: str) -> str:
        """``name``, or ``alias`` when only the alias is present."""
        return alias if self.raw.get(name) is None and self.raw.get(alias) is not None else name

    def int(self, name: str, default: int | None = None) -> int:
        value = self.raw.get(name)
        if value is None:
            if default is None:
                raise ModelLoadError(f"{self.source}: required field {name!r} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelLoadError(f"{self.source}: field {name!r} must be an integer, got {value!r}")
        return value

    def positive_int(self, name: str) -> int:
        """A required integer field >= 1 (a count or size), checked before anything divides by it."""
        value = self.int(name)
        if value < 1:
            raise ModelLoadError(f"{self.source}: field {name!r} must be >= 1, got {value}")
        return value

    def float(self, name: str, default: float) -> float:
        value = self.raw.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ModelLoadError(f"{self.source}: field {name!r} must be a number, got {value!r}")
        return float(value)
