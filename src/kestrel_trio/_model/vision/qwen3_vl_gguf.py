"""Qwen3-VL from llama.cpp's pair of files: a language-model GGUF and its ``mmproj`` GGUF.

Theory of operation: llama.cpp's converter (``convert_hf_to_gguf.py``) splits a
Qwen3-VL checkpoint in two. The language model goes to a GGUF of architecture
``qwen3vl``: a Qwen3 decoder under Qwen3's tensor names, plus the M-RoPE
sections (``qwen3vl.rope.dimension_sections``, four numbers, the fourth 0) and
the count of deepstack layers. The vision tower goes to an ``mmproj`` GGUF of
architecture ``clip`` and projector type ``qwen3vl_merger``, its tensors
renamed (``v.blk.{i}.attn_qkv``, ``mm.0``, ``v.deepstack.{block}.fc1`` ...)
and its sizes under ``clip.vision.*``. The Conv3d patch kernel is split along
time into two tensors (``v.patch_embd.weight`` and ``v.patch_embd.weight.1``).

This module maps every mmproj tensor back onto the folder checkpoint's name
(``model.visual.*``) and builds the same :class:`Qwen3VL` as the folder path:
the same config, the same vision code (kestrel_trio._model.vision.tower), the same
decoder; only where each weight comes from differs. What the file does not
say is what transformers fixes: LayerNorm eps 1e-6 and rotary base 10000 in
the tower (llama.cpp's clip code fixes the same), ``gelu_pytorch_tanh`` in the
blocks (``clip.use_gelu``; ggml's GELU is the tanh form) and exact GELU in the
mergers, and the special tokens' ids, looked up by their text in the language
model's vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from kestrel_trio._model.forms.dequant import expand_rows
from kestrel_trio._model.decoder.forward import Decoder
from kestrel_trio._model.weights.gguf_checkpoint import load_gguf_weights
from kestrel_trio._model.gguf.config import config_from_gguf, gguf_architecture
from kestrel_trio._model.gguf.reader import GgufFile
from kestrel_trio._model.forms.packed import GgmlRows, Matrix, PackedMatrix
from kestrel_trio._model.vision.qwen3_vl import Qwen3VL
from kestrel_trio._model.vision.qwen3_vl_config import Qwen3VLConfig, vision_config_from_dict
from kestrel_trio._model.weights.residency import GGUF_RESIDENCIES
from kestrel_trio._model.checkpoints.safetensors import fp32_to_bf16_bits
from kestrel_trio._model.vision.tower import VisionConfig, assemble_vision, vision_shapes
from kestrel_trio.errors import ModelLoadError

__all__ = ["LM_ARCHITECTURE", "MMPROJ_PROJECTOR", "VL_SPECIAL_TOKENS", "QWEN3_VL_MIN_PIXELS", "QWEN3_VL_MAX_PIXELS",
           "mmproj_names", "vl_config_from_gguf", "mmproj_image_fields", "load_qwen3_vl_gguf"]

LM_ARCHITECTURE = "qwen3vl"
MMPROJ_PROJECTOR = "qwen3vl_merger"
# Qwen3VLConfig's token-id fields and the vocabulary entries that hold them.
VL_SPECIAL_TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                     "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}
_PREFIX = "model.visual."
_PATCH = _PREFIX + "patch_embed.proj.weight"
_PATCH_HALVES = ("v.patch_embd.weight", "v.patch_embd.weight.1")  # the kernel's frames 0 and 1, [hidden, C, P, P]
_BLOCK_NAMES = {"norm1": "ln1", "norm2": "ln2", "attn.qkv": "attn_qkv", "attn.proj": "attn_out",
                "mlp.linear_fc1": "ffn_up", "mlp.linear_fc2": "ffn_down"}
_MERGER_NAMES = {"norm": "norm", "linear_fc1": "fc1", "linear_fc2": "fc2"}
_TOWER_THETA = 10000.0  # clip.cpp's and transformers' fixed rotary base of the tower
# Qwen3-VL's published preprocessor_config.json: the GGUF pair carries no pixel bounds.
QWEN3_VL_MIN_PIXELS = 65536
QWEN3_VL_MAX_PIXELS = 16777216


def mmproj_names(config: VisionConfig) -> dict[str, str]:
    """Checkpoint name (``model.visual.*``) -> mmproj tensor name, for every tower tensor but the patch kernel.

    The patch kernel is two mmproj tensors (:data:`_PATCH_HALVES`), one per frame of the temporal patch.
    """
    names = {_PREFIX + "patch_embed.proj.bias": "v.patch_embd.bias",
             _PREFIX + "pos_embed.weight": "v.position_embd.weight",
             _PREFIX + "merger.norm.weight": "v.post_ln.weight", _PREFIX + "merger.norm.bias": "v.post_ln.bias"}
    for kind in ("weight", "bias"):
        names[f"{_PREFIX}merger.linear_fc1.{kind}"] = f"mm.0.{kind}"
        names[f"{_PREFIX}merger.linear_fc2.{kind}"] = f"mm.2.{kind}"
        for i in range(config.depth):
            for ours, theirs in _BLOCK_NAMES.items():
                names[f"{_PREFIX}blocks.{i}.{ours}.{kind}"] = f"v.blk.{i}.{theirs}.{kind}"
        # The converter names a deepstack merger by the block it follows, not by its place in the list.
        for j, block in enumerate(config.deepstack_visual_indexes):
            for ours, theirs in _MERGER_NAMES.items():
                names[f"{_PREFIX}deepstack_merger_list.{j}.{ours}.{kind}"] = f"v.deepstack.{block}.{theirs}.{kind}"
    return names


# --------------------------------------------------------------------------- config


class _Meta:
    """Typed access to one GGUF file's metadata, errors naming the file and the key."""

    def __init__(self, gguf: GgufFile) -> None:
        self.gguf = gguf
        self.file = gguf.path.name

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = self.gguf.metadata.get(key, default)
        if value is None:
            raise ModelLoadError(f"{self.file}: GGUF metadata key {key} is missing")
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))) \
                or not isinstance(value, kind):
            raise ModelLoadError(f"{self.file}: GGUF metadata {key} has the wrong type: {value!r}")
        return value


def _check_mmproj(mmproj: GgufFile) -> _Meta:
    meta = _Meta(mmproj)
    arch = mmproj.metadata.get("general.architecture")
    if arch != "clip":
        raise ModelLoadError(f"{meta.file}: not an mmproj file: general.architecture is {arch!r}, not 'clip'")
    projector = mmproj.metadata.get("clip.projector_type")
    if projector != MMPROJ_PROJECTOR:
        raise ModelLoadError(f"{meta.file}: clip.projector_type is {projector!r}; kestrel-trio reads only "
                             f"Qwen3-VL's vision tower ({MMPROJ_PROJECTOR!r})")
    if meta.get("clip.has_vision_encoder", bool, False) is not True:
        raise ModelLoadError(f"{meta.file}: clip.has_vision_encoder is not true: the file holds no vision tower")
    return meta


def _vision_config(mmproj: GgufFile, text_hidden: int, lm_name: str) -> VisionConfig:
    meta = _check_mmproj(mmproj)
    file = meta.file
    for name in (*_PATCH_HALVES, "v.position_embd.weight"):
        if name not in mmproj.tensors:
            raise ModelLoadError(f"{file}: tensor {name!r} is missing"
                                 + (" (kestrel-trio reads Qwen3-VL's temporal patch of 2 frames)"
                                    if name == _PATCH_HALVES[1] else ""))
    patch = mmproj.tensors[_PATCH_HALVES[0]].shape  # [hidden, C, P, P]
    if len(patch) != 4:
        raise ModelLoadError(f"{file}: tensor {_PATCH_HALVES[0]!r} has shape {list(patch)}, not [hidden, C, P, P]")
    flags = meta.get("clip.vision.is_deepstack_layers", list, [])
    depth = meta.get("clip.vision.block_count", int)
    if len(flags) != depth:
        raise ModelLoadError(f"{file}: clip.vision.is_deepstack_layers has {len(flags)} entries, "
                             f"clip.vision.block_count is {depth}")
    if meta.get("clip.use_gelu", bool, False) is not True:
        raise ModelLoadError(f"{file}: clip.use_gelu is not true: Qwen3-VL's tower uses GELU")
    projection = meta.get("clip.vision.projection_dim", int)
    if projection != text_hidden:
        raise ModelLoadError(f"{file}: clip.vision.projection_dim {projection} differs from the language model's "
                             f"width {text_hidden} ({lm_name}): this mmproj file is not for this model")
    raw = {
        "depth": depth,
        "hidden_size": meta.get("clip.vision.embedding_length", int),
        "intermediate_size": meta.get("clip.vision.feed_forward_length", int),
        "num_heads": meta.get("clip.vision.attention.head_count", int),
        "in_channels": patch[1],
        "patch_size": meta.get("clip.vision.patch_size", int),
        "temporal_patch_size": len(_PATCH_HALVES),
        "spatial_merge_size": meta.get("clip.vision.spatial_merge_size", int, 2),
        "out_hidden_size": projection,
        "num_position_embeddings": mmproj.tensors["v.position_embd.weight"].shape[0],
        "hidden_act": "gelu_pytorch_tanh",
        "deepstack_visual_indexes": [i for i, flag in enumerate(flags) if flag],
        "rope_theta": _TOWER_THETA,
    }
    return vision_config_from_dict(raw, text_hidden, source=f"{file} (mmproj metadata)")


def vl_config_from_gguf(lm: GgufFile, mmproj: GgufFile) -> Qwen3VLConfig:
    """The :class:`Qwen3VLConfig` of a language-model GGUF and its mmproj GGUF, from their headers alone.

    Raises:
        ModelLoadError: naming the file and key at fault, or saying why the two files do not fit
            (the language model is not ``qwen3vl``, widths or deepstack counts differ, a special token
            is missing from the vocabulary).
    """
    arch = gguf_architecture(lm)
    if arch != LM_ARCHITECTURE:
        raise ModelLoadError(f"{lm.path.name}: an mmproj file needs a Qwen3-VL language model (GGUF architecture "
                             f"{LM_ARCHITECTURE!r}), this one is {arch!r}")
    text = config_from_gguf(lm)
    meta = _Meta(lm)
    sections = meta.get(f"{arch}.rope.dimension_sections", list)
    section = tuple(sections[:3])
    if len(sections) < 3 or any(sections[3:]) or sum(section) != text.head_dim // 2:
        raise ModelLoadError(f"{lm.path.name}: {arch}.rope.dimension_sections {sections} must be three numbers "
                             f"(and zeros) summing to head_dim/2 ({text.head_dim // 2})")
    vision = _vision_config(mmproj, text.hidden_size, lm.path.name)
    deepstack = meta.get(f"{arch}.n_deepstack_layers", int, 0)
    if deepstack != len(vision.deepstack_visual_indexes):
        raise ModelLoadError(f"{mmproj.path.name}: {len(vision.deepstack_visual_indexes)} deepstack layers, but "
                             f"{lm.path.name}'s {arch}.n_deepstack_layers is {deepstack}: this mmproj file is not "
                             f"for this model")
    tokens = lm.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        raise ModelLoadError(f"{lm.path.name}: no tokenizer.ggml.tokens, so the image tokens' ids are unknown")
    ids = {}
    for field, token in VL_SPECIAL_TOKENS.items():
        try:
            ids[field] = tokens.index(token)
        except ValueError:
            raise ModelLoadError(f"{lm.path.name}: the vocabulary has no {token} token") from None
    return Qwen3VLConfig(text=text, vision=vision, mrope_section=section, mrope_interleaved=True, **ids)


def mmproj_image_fields(mmproj: GgufFile) -> dict[str, Any]:
    """preprocessor_config.json fields for images of this tower: its patch, merge and normalisation.

    The pixel bounds are Qwen3-VL's published ones (the file holds none).
    """
    meta = _check_mmproj(mmproj)
    stats = {}
    for key in ("image_mean", "image_std"):
        value = meta.get(f"clip.vision.{key}", list)
        stats[key] = value
    return {"size": {"shortest_edge": QWEN3_VL_MIN_PIXELS, "longest_edge": QWEN3_VL_MAX_PIXELS},
            "patch_size": meta.get("clip.vision.patch_size", int),
            "merge_size": meta.get("clip.vision.spatial_merge_size", int, 2),
            "temporal_patch_size": len(_PATCH_HALVES), **stats}


# --------------------------------------------------------------------------- tensors


class _Mmproj:
    """The tower's tensors of an mmproj file under checkpoint names, checked against the config first."""

    def __init__(self, gguf: GgufFile, config: VisionConfig, progress: Callable[[int], None]) -> None:
        self.gguf = gguf
        self.file = gguf.path.name
        self.names = mmproj_names(config)
        self.progress = progress
        shapes = vision_shapes(config, _PREFIX)
        c = config
        expected = {theirs: shapes[ours] for ours, theirs in self.names.items()}
        expected.update({half: (c.hidden_size, c.in_channels, c.patch_size, c.patch_size) for half in _PATCH_HALVES})
        label = {theirs: ours for ours, theirs in self.names.items()} | {h: _PATCH for h in _PATCH_HALVES}
        for name, shape in expected.items():
            tensor = gguf.tensors.get(name)
            if tensor is None:
                raise ModelLoadError(f"{self.file}: tensor {name!r} ({label[name]}) is missing")
            if tensor.shape != shape:
                raise ModelLoadError(f"{self.file}: tensor {name!r} ({label[name]}) has shape {list(tensor.shape)}, "
                                     f"the metadata implies {list(shape)}")
        extra = sorted(set(gguf.tensors) - set(expected))
        if extra:
            raise ModelLoadError(f"{self.file}: unexpected tensor {extra[0]!r}: it is no part of Qwen3-VL's tower "
                                 f"as the metadata describes it")

    def _stored(self, name: str) -> np.ndarray:
        self.progress(self.gguf.tensors[name].nbytes)
        return self.gguf.raw_rows(name)  # [rows, row_bytes], mapped

    def _expand(self, name: str) -> np.ndarray:
        tensor = self.gguf.tensors[name]
        out = expand_rows(tensor.ggml_type, self._stored(name)).reshape(tensor.shape)  # its shape, float32
        out.flags.writeable = False
        return out

    def read(self, ours: str) -> np.ndarray:
        """Checkpoint tensor ``ours`` as float32 of the checkpoint's shape."""
        if ours == _PATCH:
            frames = [self._expand(half) for half in _PATCH_HALVES]  # [hidden, C, P, P] each
            return np.stack(frames, axis=2)  # [hidden, C, 2, P, P], the Conv3d kernel
        return self._expand(self.names[ours])

    def read_bf16(self, ours: str) -> np.ndarray:
        """Checkpoint tensor ``ours`` expanded, then rounded to bf16 bits (uint16, its shape)."""
        return fp32_to_bf16_bits(self.read(ours))

    def stored(self, ours: str) -> Matrix:
        """Matrix ``ours`` as the file stores it: float32 when F32, else its ggml blocks, expanded at use."""
        if ours == _PATCH:  # two tensors joined: small ([hidden, C*2*P*P]), expanded once
            return self.read(ours)
        name = self.names[ours]
        tensor = self.gguf.tensors[name]
        if tensor.ggml_type.name == "F32":
            return np.array(self._expand(name))  # an array of its own, not the mapped page cache's
        return PackedMatrix((GgmlRows(tensor.ggml_type, self._stored(name)),))


def load_qwen3_vl_gguf(lm_path: Path, mmproj_path: Path, progress: Callable[[float], None] | None = None,
                       residency: str = "gguf") -> Qwen3VL:
    """Load Qwen3-VL from its language-model GGUF and its mmproj GGUF.

    Args:
        lm_path: the language model (GGUF architecture ``qwen3vl``).
        mmproj_path: its vision tower (llama.cpp's ``mmproj`` file, projector ``qwen3vl_merger``).
        progress: called with the fraction of both files' tensor bytes read or mapped (0 to 1).
        residency: "gguf": matrices as stored (the tower's too, expanded at each use); "fp32": expanded
            at load; "bf16": expanded, then rounded (see load_gguf_weights).

    Raises:
        ModelLoadError: naming the file, key or tensor at fault, or why the two files do not fit.
    """
    if residency not in GGUF_RESIDENCIES:
        raise ModelLoadError(f"a GGUF file's weights residency must be one of {', '.join(GGUF_RESIDENCIES)}, "
                             f"got {residency!r}")
    lm, mmproj = GgufFile(lm_path), GgufFile(mmproj_path)
    config = vl_config_from_gguf(lm, mmproj)
    lm_bytes = sum(t.nbytes for t in lm.tensors.values())
    total = max(lm_bytes + sum(t.nbytes for t in mmproj.tensors.values()), 1)
    done = [lm_bytes]

    def text_progress(fraction: float) -> None:
        if progress is not None:
            progress(fraction * lm_bytes / total)

    def tower_progress(nbytes: int) -> None:
        done[0] += nbytes
        if progress is not None:
            progress(min(done[0] / total, 1.0))

    tower = _Mmproj(mmproj, config.vision, tower_progress)  # checked before the language model is assembled
    weights = load_gguf_weights(lm, config.text, LM_ARCHITECTURE, text_progress, residency)
    if residency == "gguf":
        vision = assemble_vision(config.vision, tower.read, _PREFIX, None, stored=tower.stored)
    else:
        vision = assemble_vision(config.vision, tower.read, _PREFIX, tower.read_bf16 if residency == "bf16" else None)
    return Qwen3VL(config=config, decoder=Decoder.build(config.text, weights), vision=vision)

