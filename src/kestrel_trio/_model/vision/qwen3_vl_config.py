"""Qwen3-VL's config.json: the language model as the equivalent Qwen3 config, the vision tower's fields, M-RoPE.

Both checkpoint forms build a :class:`Qwen3VLConfig` here: a folder's config.json (transformers 4 or 5 style,
:func:`vl_config_from_dict`) and a GGUF pair, whose mmproj metadata is read as vision_config fields
(:func:`vision_config_from_dict`, from :mod:`kestrel_trio._model.vision.qwen3_vl_gguf`). Every size is
checked and bounded before anything is built from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from kestrel_trio._model.checkpoints.config import ModelConfig, config_from_dict, read_config_json
from kestrel_trio._model.vision.tower import VisionConfig
from kestrel_trio.errors import ModelLoadError

__all__ = ["ARCHITECTURE", "Qwen3VLConfig", "is_qwen3_vl", "read_vl_config", "vl_config_from_dict",
           "vision_config_from_dict"]

ARCHITECTURE = "Qwen3VLForConditionalGeneration"
_DEFAULT_TEXT_THETA = 500000.0  # Qwen3VLTextConfig's default when config.json names none


@attrs.frozen
class Qwen3VLConfig:
    """A Qwen3-VL config.json.

    Attributes:
        text: the language model, as the equivalent Qwen3ForCausalLM config.
        vision: the vision tower.
        mrope_section: rotary frequencies given to (T, H, W); they sum to head_dim / 2.
        mrope_interleaved: as written in the file. transformers' Qwen3-VL always
            interleaves, and so does this module.
        image_token_id: ``<|image_pad|>``.
        video_token_id: ``<|video_pad|>``.
        vision_start_token_id: ``<|vision_start|>``.
        vision_end_token_id: ``<|vision_end|>``.
    """

    text: ModelConfig
    vision: VisionConfig
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    mrope_interleaved: bool = True
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653


def is_qwen3_vl(raw: dict[str, Any]) -> bool:
    """Whether a parsed config.json describes a Qwen3-VL checkpoint."""
    return ARCHITECTURE in (raw.get("architectures") or ())


def read_vl_config(folder: Path) -> Qwen3VLConfig:
    """Read and validate ``folder/config.json`` of a Qwen3-VL checkpoint.

    Raises:
        ModelLoadError: the file is missing or unreadable, or a field is wrong.
    """
    raw, path = read_config_json(folder)
    return vl_config_from_dict(raw, source=str(path))


def vl_config_from_dict(raw: dict[str, Any], *, source: str = "config.json") -> Qwen3VLConfig:
    """Build a :class:`Qwen3VLConfig` from config.json (transformers 4 or 5 style)."""
    if not is_qwen3_vl(raw):
        raise ModelLoadError(f"{source}: architectures {raw.get('architectures')!r} does not name {ARCHITECTURE}")
    text_raw = _section(raw, "text_config", source)
    vision_raw = _section(raw, "vision_config", source)
    text_dict, section, interleaved = _text_as_qwen3(raw, text_raw, source)
    text = config_from_dict(text_dict, source=f"{source} text_config")
    if len(section) != 3 or sum(section) != text.head_dim // 2:
        raise ModelLoadError(
            f"{source}: text_config mrope_section {list(section)} must be 3 numbers summing to head_dim/2 "
            f"({text.head_dim // 2})"
        )
    ids = {name: _int(raw, name, default, source) for name, default in (
        ("image_token_id", 151655), ("video_token_id", 151656),
        ("vision_start_token_id", 151652), ("vision_end_token_id", 151653))}
    return Qwen3VLConfig(
        text=text, vision=vision_config_from_dict(vision_raw, text.hidden_size, source=f"{source} vision_config"),
        mrope_section=section, mrope_interleaved=interleaved, **ids,
    )


def _section(raw: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    value = raw.get(name)
    if not isinstance(value, dict):
        raise ModelLoadError(f"{source}: field {name!r} is missing or not an object")
    return value


def _int(raw: dict[str, Any], name: str, default: int, source: str) -> int:
    value = raw.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelLoadError(f"{source}: field {name!r} must be a non-negative integer, got {value!r}")
    return value


def _text_as_qwen3(raw: dict[str, Any], text: dict[str, Any], source: str
                   ) -> tuple[dict[str, Any], tuple[int, ...], bool]:
    """text_config rewritten as a Qwen3ForCausalLM config.json, plus the M-RoPE fields taken out of it."""
    out = dict(text)
    section: Any = None
    interleaved: Any = True
    # transformers 5 keeps M-RoPE fields in rope_parameters, transformers 4 in rope_scaling.
    for key in ("rope_scaling", "rope_parameters"):
        block = out.get(key)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise ModelLoadError(f"{source}: text_config field {key!r} must be an object or null")
        block = dict(block)
        section = block.pop("mrope_section", section)
        interleaved = block.pop("mrope_interleaved", interleaved)
        for name in ("rope_type", "type"):
            if block.get(name) == "mrope":  # Qwen2-VL-era spelling of plain rotary frequencies
                block[name] = "default"
        out[key] = block
    if not any("rope_theta" in (out.get(k) or {}) for k in ("rope_scaling", "rope_parameters")):
        out.setdefault("rope_theta", _DEFAULT_TEXT_THETA)
    section = (24, 20, 20) if section is None else section
    if not isinstance(section, (list, tuple)) or not all(isinstance(s, int) and s >= 0 for s in section):
        raise ModelLoadError(f"{source}: text_config mrope_section must be a list of integers, got {section!r}")
    out["architectures"] = ["Qwen3ForCausalLM"]
    out.setdefault("max_position_embeddings", 128000)
    # transformers ties by the top-level flag (default false); text_config's copy is not read.
    out["tie_word_embeddings"] = raw.get("tie_word_embeddings", False)
    return out, tuple(section), bool(interleaved)


# Upper bounds on vision_config sizes: far above any released vision tower (Qwen3-VL: depth 27, hidden 1152,
# 2304 position embeddings), far below a 1 KiB file asking for gigabytes of per-block objects.
_VISION_BOUNDS = {"depth": 1024, "hidden_size": 1 << 16, "intermediate_size": 1 << 20, "num_heads": 1024,
                  "in_channels": 64, "patch_size": 1024, "temporal_patch_size": 64, "spatial_merge_size": 64,
                  "out_hidden_size": 1 << 16, "num_position_embeddings": 1 << 24}


def vision_config_from_dict(raw: dict[str, Any], text_hidden: int, *, source: str) -> VisionConfig:
    """A :class:`VisionConfig` from config.json's ``vision_config`` fields, every size bounded and checked.

    Args:
        raw: the fields (absent ones take transformers' defaults).
        text_hidden: the language model's width, which ``out_hidden_size`` must equal.
        source: where the fields come from, for messages.
    """
    defaults = VisionConfig()
    where = source

    def number(name: str, default: int) -> int:
        value = raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelLoadError(f"{where}: field {name!r} must be a positive integer, got {value!r}")
        if value > _VISION_BOUNDS[name]:  # before any per-block list or shape is built from it
            raise ModelLoadError(f"{where}: field {name!r} is {value}, above the most kestrel-trio accepts "
                                 f"({_VISION_BOUNDS[name]})")
        return value

    fields = {name: number(name, getattr(defaults, name)) for name in (
        "depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
        "temporal_patch_size", "spatial_merge_size", "out_hidden_size", "num_position_embeddings")}
    act = raw.get("hidden_act", defaults.hidden_act)
    if act not in ("gelu_pytorch_tanh", "gelu"):
        raise ModelLoadError(f"{where}: hidden_act {act!r} is not supported (only 'gelu_pytorch_tanh' and 'gelu')")
    indexes = raw.get("deepstack_visual_indexes", list(defaults.deepstack_visual_indexes))
    if not isinstance(indexes, list) or not all(isinstance(i, int) and 0 <= i < fields["depth"] for i in indexes):
        raise ModelLoadError(f"{where}: deepstack_visual_indexes {indexes!r} must be block indices below depth")
    rope = raw.get("rope_parameters") or {}
    theta = rope.get("rope_theta", raw.get("rope_theta", defaults.rope_theta)) if isinstance(rope, dict) else None
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise ModelLoadError(f"{where}: rope_theta must be a positive number, got {theta!r}")
    config = VisionConfig(**fields, hidden_act=act, deepstack_visual_indexes=tuple(indexes), rope_theta=float(theta))
    if config.hidden_size % config.num_heads or config.head_dim % 4:
        raise ModelLoadError(f"{where}: hidden_size / num_heads must be a multiple of 4 (2-D rotary halves)")
    if config.grid_side**2 != config.num_position_embeddings:
        raise ModelLoadError(f"{where}: num_position_embeddings {config.num_position_embeddings} is not a square")
    if config.out_hidden_size != text_hidden:
        raise ModelLoadError(
            f"{where}: out_hidden_size {config.out_hidden_size} differs from text_config hidden_size {text_hidden}"
        )
    return config
