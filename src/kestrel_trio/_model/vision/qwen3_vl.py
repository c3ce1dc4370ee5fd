"""Qwen3-VL: checked weights from a folder, 3-D (M-RoPE) positions and the forward pass.

Its config.json is read in :mod:`kestrel_trio._model.vision.qwen3_vl_config`, the vision tower is
:mod:`kestrel_trio._model.vision.tower`, a GGUF pair is loaded in :mod:`kestrel_trio._model.vision.qwen3_vl_gguf`.

Theory of operation: the language model of Qwen3-VL is a Qwen3 decoder; only
three things differ when a prompt holds images:

1. each ``<|image_pad|>`` row's input embedding is replaced by the vision
   tower's output for that image token;
2. rotary angles come from 3-D positions (temporal, row, column). Text tokens
   have all three equal to a running counter; an image's tokens share the
   counter's value for T and add their row / column for H / W; after an
   image the counter resumes at ``max(position) + 1``. Frequencies are
   interleaved: T, H, W, T, H, W, ... (``mrope_section`` says how many of each);
3. after decoder layers 0, 1, ... the deepstack features are added to the
   image rows.

Text rows whose three positions are equal rotate exactly as 1-D RoPE does, so
every forward without image rows -- text-only prompts and every decode step --
runs through the plain Qwen3 :func:`forward` with position ``p + rope_delta``,
where ``rope_delta`` (<= 0) is how far the prompt's 3-D counter lags its
length. Only prefill chunks holding image rows pass the three changes to
:func:`forward` as :class:`RowOverrides`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Generator

import attrs
import numpy as np

from kestrel_trio._model.cache.kv_cache import KVCache
from kestrel_trio._model.checkpoints.safetensors import SafetensorsCheckpoint
from kestrel_trio._model.checkpoints.shapes import IGNORED_SUFFIXES, check_tensor_set, expected_shapes
from kestrel_trio._model.decoder.forward import Decoder, RowOverrides, forward
from kestrel_trio._model.decoder.rope import Rope
from kestrel_trio._model.vision.qwen3_vl_config import ARCHITECTURE, Qwen3VLConfig, read_vl_config
from kestrel_trio._model.vision.tower import (
    ImageFeatures,
    VisionWeights,
    assemble_vision,
    encode_images_steps,
    run_to_end,
    vision_shapes,
)
from kestrel_trio._model.weights.assemble import CheckpointReader
from kestrel_trio._model.weights.residency import assemble_resident, check_folder_residency
from kestrel_trio.errors import BadRequestError

__all__ = ["Qwen3VL", "VLPrompt", "expected_vl_shapes", "load_qwen3_vl", "rope_index", "mrope_cos_sin"]

_TEXT_PREFIX = "model.language_model."
_VISION_PREFIX = "model.visual."


# --------------------------------------------------------------------------- weights


def _text_name(name: str) -> str:
    """A Qwen3 tensor name as the Qwen3-VL checkpoint spells it."""
    return _TEXT_PREFIX + name[len("model."):] if name.startswith("model.") else name


def expected_vl_shapes(config: Qwen3VLConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name of the checkpoint (``model.visual.*``, ``model.language_model.*``, ``lm_head.weight``)."""
    shapes = {_text_name(name): shape for name, shape in expected_shapes(config.text).items()}
    shapes.update(vision_shapes(config.vision, _VISION_PREFIX))
    return shapes


def check_vl_tensors(checkpoint: SafetensorsCheckpoint, config: Qwen3VLConfig) -> None:
    """Raise ModelLoadError naming the first missing, unexpected or misshapen tensor."""
    tied_copy = {"lm_head.weight"} if config.text.tie_word_embeddings else set()
    check_tensor_set(checkpoint, expected_vl_shapes(config),
                     lambda name: name in tied_copy or name.endswith(IGNORED_SUFFIXES), ARCHITECTURE)


# --------------------------------------------------------------------------- positions


def rope_index(token_ids: np.ndarray, image_grid_thw: np.ndarray | None, *, image_token_id: int,
               spatial_merge_size: int, video_grid_thw: np.ndarray | None = None,
               video_token_id: int | None = None) -> tuple[np.ndarray, int]:
    """3-D rotary positions of a prompt whose ``<|image_pad|>`` (and ``<|video_pad|>``) runs are already expanded.

    A video of ``t`` temporal patches is ``t`` runs of ``<|video_pad|>``, one per temporal patch (the
    processor puts each one's timestamp text between them), each positioned as an image of one frame,
    as transformers' Qwen3-VL does.

    Args:
        token_ids: int [T].
        image_grid_thw: int [n_images, 3] in prompt order, or None.
        image_token_id: the ``<|image_pad|>`` id.
        spatial_merge_size: patches per side of one image token.
        video_grid_thw: int [n_videos, 3] in prompt order, or None.
        video_token_id: the ``<|video_pad|>`` id (needed with ``video_grid_thw``).

    Returns:
        ``positions`` int64 [3, T] (rows T, H, W) and ``rope_delta``, the
        offset that continues them: the token at sequence index ``i >= T``
        has all three positions equal to ``i + rope_delta``.

    Raises:
        BadRequestError: the pad runs and the grids do not match.
    """
    ids = np.asarray(token_ids, dtype=np.int64)  # [T]
    grids = {kind: [] if thw is None else np.asarray(thw, dtype=np.int64).reshape(-1, 3).tolist()
             for kind, thw in (("image", image_grid_thw), ("video", video_grid_thw))}
    grids["video"] = [[1, h, w] for t, h, w in grids["video"] for _ in range(t)]  # one run per temporal patch
    pad_ids = {"image": image_token_id, "video": video_token_id}
    positions = np.empty((3, ids.size), dtype=np.int64)  # [3, T]
    is_pad = (ids == image_token_id) | ((ids == video_token_id) if video_token_id is not None else False)  # [T]
    pads = np.append(np.flatnonzero(is_pad), ids.size)  # [n_pads + 1], ends every text run
    counter, index, used = 0, 0, {"image": 0, "video": 0}
    while index < ids.size:
        if not is_pad[index]:
            end = int(pads[np.searchsorted(pads, index)])
            positions[:, index:end] = counter + np.arange(end - index)  # [3, run]
            counter += end - index
            index = end
            continue
        kind = "image" if ids[index] == image_token_id else "video"
        pad, number = f"<|{kind}_pad|>", used[kind]
        if number >= len(grids[kind]):
            raise BadRequestError(f"the prompt has more {pad} runs than {kind} grids ({len(grids[kind])})",
                                  param="messages")
        t, h, w = grids[kind][number]
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        count = t * gh * gw
        if index + count > ids.size or not (ids[index : index + count] == pad_ids[kind]).all():
            raise BadRequestError(f"{kind} grid {number} needs {count} {pad} tokens in a row", param="messages")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")  # [t, gh, gw] each
        positions[:, index : index + count] = np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + counter  # [3, count]
        counter += max(h, w) // spatial_merge_size
        index += count
        used[kind] += 1
    for kind in ("image", "video"):
        if used[kind] != len(grids[kind]):
            raise BadRequestError(f"{len(grids[kind])} {kind} grids but {used[kind]} <|{kind}_pad|> runs in the "
                                  "prompt", param="messages")
    last = int(positions.max()) + 1 if ids.size else 0
    return positions, last - int(ids.size)


def mrope_cos_sin(rope: Rope, positions: np.ndarray, section: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Interleaved M-RoPE cos and sin, each float32 [T, head_dim/2], for ``positions`` [3, T].

    Frequency j rotates by the T position, except j = 1, 4, 7, ... (the first
    ``section[1]`` of them) by H and j = 2, 5, 8, ... (``section[2]``) by W.
    """
    angles = positions.astype(np.float32)[:, :, None] * rope.inv_freq[None, None, :]  # [3, T, head_dim/2]
    mixed = angles[0].copy()  # [T, head_dim/2]
    for axis, offset in ((1, 1), (2, 2)):
        picked = slice(offset, section[axis] * 3, 3)
        mixed[:, picked] = angles[axis][:, picked]
    cos, sin = np.cos(mixed), np.sin(mixed)  # [T, head_dim/2] each
    if rope.attention_scaling != 1.0:
        cos *= np.float32(rope.attention_scaling)
        sin *= np.float32(rope.attention_scaling)
    return cos, sin


# --------------------------------------------------------------------------- model


@attrs.frozen
class VLPrompt:
    """A prompt ready for prefill: expanded token ids, 3-D positions and image features.

    Attributes:
        token_ids: int64 [T], each image's pad run already expanded.
        positions: int64 [3, T].
        rope_delta: decode positions are ``cache.length + rope_delta``.
        image_rows: int64 [n_tokens], the rows of ``token_ids`` that are image or video tokens, ascending.
        features: the vision tower's output for those rows, in row order (None without images or videos).
    """

    token_ids: np.ndarray
    positions: np.ndarray
    rope_delta: int
    image_rows: np.ndarray
    features: ImageFeatures | None


@attrs.frozen
class Qwen3VL:
    """A loaded Qwen3-VL: the Qwen3 decoder of its language model plus the vision tower."""

    config: Qwen3VLConfig
    decoder: Decoder
    vision: VisionWeights

    def new_cache(self) -> KVCache:
        """An empty KV cache for one sequence."""
        return self.decoder.new_cache()

    def encode_images(self, pixel_values: np.ndarray, image_grid_thw: np.ndarray) -> ImageFeatures:
        """The vision tower over ``pixel_values`` [n_patches, C*T*P*P] of images ``image_grid_thw`` [n, 3].

        Raises:
            BadRequestError: the shapes disagree with each other or the config.
        """
        return run_to_end(self.encode_images_steps(pixel_values, image_grid_thw))

    def encode_images_steps(self, pixel_values: np.ndarray, image_grid_thw: np.ndarray
                            ) -> Generator[None, None, ImageFeatures]:
        """:meth:`encode_images` as a generator that yields after each vision block (shapes checked at once)."""
        v = self.config.vision
        grids = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)  # [n_images, 3]
        pixels = np.asarray(pixel_values, dtype=np.float32)  # [n_patches, C*T*P*P]
        if (grids < 1).any() or (grids[:, 1:] % v.spatial_merge_size).any():
            raise BadRequestError(f"image grids must be positive multiples of {v.spatial_merge_size}", param="messages")
        if pixels.ndim != 2 or pixels.shape != (int(grids.prod(axis=1).sum()), v.patch_dim):
            raise BadRequestError(
                f"pixel_values has shape {list(pixels.shape)}, the grids imply "
                f"[{int(grids.prod(axis=1).sum())}, {v.patch_dim}]", param="messages")
        return self.decoder.backend.run_steps(encode_images_steps(v, self.vision, pixels, grids))  # its settings

    def prepare(self, token_ids: np.ndarray, pixel_values: np.ndarray | None = None,
                image_grid_thw: np.ndarray | None = None, pixel_values_videos: np.ndarray | None = None,
                video_grid_thw: np.ndarray | None = None) -> VLPrompt:
        """Encode the images and videos of a prompt and lay out its positions.

        Args:
            token_ids: int [T], pad runs expanded (see kestrel_trio.text.media.images); a video's runs as
                :func:`rope_index` says.
            pixel_values: float32 [n_patches, C*T*P*P] of every image, in prompt order.
            image_grid_thw: int [n_images, 3].
            pixel_values_videos: float32 [n_patches, C*T*P*P] of every video, in prompt order.
            video_grid_thw: int [n_videos, 3] (temporal patches, patch rows, patch columns).
        """
        return run_to_end(self.prepare_steps(token_ids, pixel_values, image_grid_thw, pixel_values_videos,
                                             video_grid_thw))

    def prepare_steps(self, token_ids: np.ndarray, pixel_values: np.ndarray | None = None,
                      image_grid_thw: np.ndarray | None = None, pixel_values_videos: np.ndarray | None = None,
                      video_grid_thw: np.ndarray | None = None) -> Generator[None, None, VLPrompt]:
        """:meth:`prepare` as a generator that yields after each vision block, so a driver can stop between them."""
        c = self.config
        ids = np.asarray(token_ids, dtype=np.int64)  # [T]
        # Without videos a <|video_pad|> is text, as it always was here (only grids make pads of them).
        videos = video_grid_thw is not None and len(video_grid_thw) > 0
        positions, delta = rope_index(ids, image_grid_thw, image_token_id=c.image_token_id,
                                      spatial_merge_size=c.vision.spatial_merge_size,
                                      video_grid_thw=video_grid_thw if videos else None,
                                      video_token_id=c.video_token_id if videos else None)
        encoded = []  # (rows, features) of the images, then of the videos
        for token, pixels, grids, what in ((c.image_token_id, pixel_values, image_grid_thw, "image"),
                                           (c.video_token_id, pixel_values_videos, video_grid_thw, "video")):
            if grids is None or not len(grids):
                continue
            if pixels is None:
                raise BadRequestError(f"{what} grids were given without their pixel values", param="messages")
            features = yield from self.encode_images_steps(pixels, grids)
            encoded.append((np.flatnonzero(ids == token), features))  # [n_tokens], [n_tokens, out_hidden]
        if not encoded:
            return VLPrompt(token_ids=ids, positions=positions, rope_delta=delta,
                            image_rows=np.flatnonzero(ids == c.image_token_id), features=None)
        rows = np.concatenate([r for r, _ in encoded])  # [n_tokens], images' rows then videos'
        order = np.argsort(rows, kind="stable")  # into prompt order, as transformers' joint deepstack mask
        features = ImageFeatures(
            embeds=np.concatenate([f.embeds for _, f in encoded])[order],  # [n_tokens, out_hidden]
            deepstack=tuple(np.concatenate(layer)[order] for layer in zip(*(f.deepstack for _, f in encoded))),
        )
        return VLPrompt(token_ids=ids, positions=positions, rope_delta=delta, image_rows=rows[order],
                        features=features)

    def prefill(self, cache: KVCache, prompt: VLPrompt, start: int = 0, end: int | None = None, *,
                all_logits: bool = False) -> np.ndarray:
        """Feed prompt rows ``start:end`` (the cache must hold exactly ``start`` tokens).

        Returns:
            float32 logits, [end - start, vocab] if ``all_logits`` else [vocab].
        """
        end = prompt.token_ids.size if end is None else end
        ids = prompt.token_ids[start:end]  # [n]
        positions = prompt.positions[:, start:end]  # [3, n]
        lo, hi = np.searchsorted(prompt.image_rows, [start, end])
        if hi == lo and (positions == positions[:1]).all():
            logits = forward(self.decoder, ids, positions[0], [cache], [ids.size], all_logits=all_logits)
        else:
            assert prompt.features is not None
            image = ImageFeatures(
                embeds=prompt.features.embeds[lo:hi],
                deepstack=tuple(d[lo:hi] for d in prompt.features.deepstack),
            )
            logits = _forward_with_images(self, ids, positions, cache, prompt.image_rows[lo:hi] - start, image,
                                          all_logits)
        return logits if all_logits else logits[-1]

    def step(self, cache: KVCache, token_ids: np.ndarray, rope_delta: int, *, all_logits: bool = False) -> np.ndarray:
        """New text tokens after the prompt (decode), at positions ``cache.length + rope_delta``."""
        ids = np.asarray(token_ids, dtype=np.int64)  # [n]
        positions = np.arange(cache.length, cache.length + ids.size, dtype=np.int64) + rope_delta  # [n]
        logits = forward(self.decoder, ids, positions, [cache], [ids.size], all_logits=all_logits)
        return logits if all_logits else logits[0]


def load_qwen3_vl(folder: Path, progress: Callable[[float], None] | None = None, residency: str = "fp32",
                  quantized_cache: Path | None = None) -> Qwen3VL:
    """Read config.json and every weight of the Qwen3-VL checkpoint in ``folder``.

    Args:
        folder: the checkpoint folder.
        progress: called with the fraction of bytes read so far (0 to 1).
        residency: one of FOLDER_RESIDENCIES for the language model (see
            :func:`kestrel_trio._model.weights.residency.load_weights`); the vision
            tower's matrices are fp32 in fp32 mode and bf16 otherwise (int8/int4
            quantize the language model only).
        quantized_cache: the folder of int8/int4 cache files; None: no cache.

    Raises:
        ModelLoadError: naming the file or tensor at fault.
    """
    check_folder_residency(residency)
    config = read_vl_config(folder)
    checkpoint = SafetensorsCheckpoint(folder)
    check_vl_tensors(checkpoint, config)
    reader = CheckpointReader(checkpoint, progress)
    text_names = {"model." + n[len(_TEXT_PREFIX):] for n in checkpoint.tensors if n.startswith(_TEXT_PREFIX)}
    weights = assemble_resident(config.text, reader, residency, text_names, rename=_text_name,
                                quantized_cache=quantized_cache)
    vision = assemble_vision(config.vision, reader.read, _VISION_PREFIX,
                             reader.read_bf16 if residency != "fp32" else None)
    return Qwen3VL(config=config, decoder=Decoder.build(config.text, weights), vision=vision)


# --------------------------------------------------------------------------- forward with images


def _forward_with_images(model: Qwen3VL, ids: np.ndarray, positions: np.ndarray, cache: KVCache,
                         image_rows: np.ndarray, image: ImageFeatures, all_logits: bool) -> np.ndarray:
    """forward() over one segment with its image rows: image embeddings, 3-D M-RoPE angles, deepstack."""
    cos_sin = mrope_cos_sin(model.decoder.rope, positions, model.config.mrope_section)  # [n, head_dim/2] each
    overrides = RowOverrides(rows=image_rows, embeds=image.embeds, deepstack=image.deepstack, cos_sin=cos_sin)
    return forward(model.decoder, ids, positions[0], [cache], [ids.size], all_logits=all_logits,
                   overrides=overrides)  # [rows, vocab]
