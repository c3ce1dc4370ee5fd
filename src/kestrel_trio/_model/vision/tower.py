"""The Qwen3-VL vision tower in numpy: pixels in, image embeddings out.

Theory of operation: the image processor hands over ``pixel_values``
[n_patches, C*T*P*P], one row per patch, with patches in *merge-block order*
(each run of merge^2 rows is one merge x merge square of the grid) and
``grid_thw`` (frames, patch rows, patch columns) per image. The tower embeds
each patch (the Conv3d is a single matmul: kernel == stride == one patch),
adds a learned position embedding resampled bilinearly to the image's grid,
runs ViT blocks with 2-D rotary attention (per frame, not causal), and folds
each merge^2 block into one token of the language model's width (the patch
merger). Some blocks' outputs also go through their own "deepstack" mergers;
the language model adds those to its hidden states after its first layers.
"""

from __future__ import annotations

import math
from typing import Callable, Generator, TypeVar

import attrs
import numpy as np

from kestrel_trio._model.decoder.layers import linear
from kestrel_trio._model.weights.assemble import Bf16Matrix, Matrix
from kestrel_trio._model.decoder.rope import apply_rope

T = TypeVar("T")

__all__ = [
    "VisionConfig", "VisionBlock", "PatchMerger", "VisionWeights", "ImageFeatures",
    "vision_shapes", "assemble_vision", "encode_images", "encode_images_steps", "run_to_end", "gelu_erf", "gelu_tanh",
]

_LAYER_NORM_EPS = 1e-6  # fixed in the reference, not in config.json


@attrs.frozen
class VisionConfig:
    """``vision_config`` of a Qwen3-VL config.json, with transformers' defaults.

    Attributes:
        depth: ViT blocks.
        hidden_size: ViT width (channels).
        intermediate_size: ViT MLP width (channels).
        num_heads: attention heads.
        in_channels: image channels (3).
        patch_size: patch side (pixels).
        temporal_patch_size: frames per patch (images repeat their one frame).
        spatial_merge_size: patches per side of one language-model token.
        out_hidden_size: the language model's width (channels).
        num_position_embeddings: learned positions, a square number.
        deepstack_visual_indexes: blocks whose outputs feed the deepstack mergers.
        hidden_act: "gelu_pytorch_tanh" or "gelu" for the block MLPs.
        rope_theta: base wavelength of the 2-D rotary embedding.
    """

    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values per patch row of pixel_values: C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merged_size(self) -> int:
        """Width of one merge block flattened: hidden * merge^2."""
        return self.hidden_size * self.spatial_merge_size**2

    @property
    def grid_side(self) -> int:
        """Side of the square learned position grid."""
        return math.isqrt(self.num_position_embeddings)


@attrs.frozen
class VisionBlock:
    norm1_weight: np.ndarray  # [hidden]
    norm1_bias: np.ndarray  # [hidden]
    qkv_weight: Matrix  # [3*hidden, hidden]
    qkv_bias: np.ndarray  # [3*hidden]
    proj_weight: Matrix  # [hidden, hidden]
    proj_bias: np.ndarray  # [hidden]
    norm2_weight: np.ndarray  # [hidden]
    norm2_bias: np.ndarray  # [hidden]
    fc1_weight: Matrix  # [inter, hidden]
    fc1_bias: np.ndarray  # [inter]
    fc2_weight: Matrix  # [hidden, inter]
    fc2_bias: np.ndarray  # [hidden]


@attrs.frozen
class PatchMerger:
    """LayerNorm, then fc1 -> GELU -> fc2 over each merge block.

    ``postshuffle`` mergers (deepstack) normalise the flattened block
    [hidden*merge^2]; the final merger normalises each patch [hidden] first.
    """

    postshuffle: bool
    norm_weight: np.ndarray  # [hidden*merge^2] if postshuffle else [hidden]
    norm_bias: np.ndarray  # same as norm_weight
    fc1_weight: Matrix  # [hidden*merge^2, hidden*merge^2]
    fc1_bias: np.ndarray  # [hidden*merge^2]
    fc2_weight: Matrix  # [out_hidden, hidden*merge^2]
    fc2_bias: np.ndarray  # [out_hidden]


@attrs.frozen
class VisionWeights:
    patch_weight: Matrix  # [hidden, C*T*P*P] (the Conv3d kernel, flattened)
    patch_bias: np.ndarray  # [hidden]
    pos_embed: np.ndarray  # [num_position_embeddings, hidden]
    blocks: tuple[VisionBlock, ...]
    merger: PatchMerger
    deepstack_mergers: tuple[PatchMerger, ...]


@attrs.frozen
class ImageFeatures:
    """The tower's output for the images of one prompt, in prompt order.

    Attributes:
        embeds: [n_tokens, out_hidden], one row per ``<|image_pad|>`` after expansion.
        deepstack: one [n_tokens, out_hidden] per deepstack merger, added after
            language-model layers 0, 1, ...
    """

    embeds: np.ndarray
    deepstack: tuple[np.ndarray, ...]


# --------------------------------------------------------------------------- weights


def vision_shapes(config: VisionConfig, prefix: str = "model.visual.") -> dict[str, tuple[int, ...]]:
    """Every vision tensor name (checkpoint spelling) with its shape."""
    c = config
    h, inter, m = c.hidden_size, c.intermediate_size, c.merged_size
    shapes: dict[str, tuple[int, ...]] = {
        prefix + "patch_embed.proj.weight": (h, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size),
        prefix + "patch_embed.proj.bias": (h,),
        prefix + "pos_embed.weight": (c.num_position_embeddings, h),
    }
    for i in range(c.depth):
        b = f"{prefix}blocks.{i}."
        shapes.update({
            b + "norm1.weight": (h,), b + "norm1.bias": (h,), b + "norm2.weight": (h,), b + "norm2.bias": (h,),
            b + "attn.qkv.weight": (3 * h, h), b + "attn.qkv.bias": (3 * h,),
            b + "attn.proj.weight": (h, h), b + "attn.proj.bias": (h,),
            b + "mlp.linear_fc1.weight": (inter, h), b + "mlp.linear_fc1.bias": (inter,),
            b + "mlp.linear_fc2.weight": (h, inter), b + "mlp.linear_fc2.bias": (h,),
        })
    mergers = [(prefix + "merger.", h)]
    mergers += [(f"{prefix}deepstack_merger_list.{j}.", m) for j in range(len(c.deepstack_visual_indexes))]
    for p, norm in mergers:
        shapes.update({
            p + "norm.weight": (norm,), p + "norm.bias": (norm,),
            p + "linear_fc1.weight": (m, m), p + "linear_fc1.bias": (m,),
            p + "linear_fc2.weight": (c.out_hidden_size, m), p + "linear_fc2.bias": (c.out_hidden_size,),
        })
    return shapes


def assemble_vision(config: VisionConfig, read: Callable[[str], np.ndarray], prefix: str = "model.visual.",
                    read_bf16: Callable[[str], np.ndarray] | None = None, *,
                    stored: Callable[[str], Matrix] | None = None) -> VisionWeights:
    """Build :class:`VisionWeights` from checked tensors.

    Args:
        config: the tower's configuration.
        read: a tensor as float32, by checkpoint name.
        prefix: the tower's name prefix in the checkpoint.
        read_bf16: a tensor as bf16 bits, by name: when given, the matrices
            stay bf16 (:class:`Bf16Matrix`, upcast at use); vectors, and the
            position table (looked up by row), are float32 either way.
        stored: a matrix in the form it stays in, by name (a GGUF's packed
            blocks); overrides ``read_bf16``. A float32 array it returns for the
            Conv3d kernel is flattened as ``read``'s is.
    """
    def matrix(name: str, rows: int | None = None) -> Matrix:
        if stored is not None:
            held = stored(name)  # [out, in], or the Conv3d kernel as float32
            return held.reshape(rows, -1) if rows is not None and isinstance(held, np.ndarray) else held
        array = read_bf16(name) if read_bf16 is not None else read(name)  # [out, in] (or the Conv3d kernel)
        if rows is not None:
            array = array.reshape(rows, -1)  # [rows, in]
        return Bf16Matrix((array,)) if read_bf16 is not None else array

    def block(i: int) -> VisionBlock:
        b = f"{prefix}blocks.{i}."
        return VisionBlock(
            norm1_weight=read(b + "norm1.weight"), norm1_bias=read(b + "norm1.bias"),
            qkv_weight=matrix(b + "attn.qkv.weight"), qkv_bias=read(b + "attn.qkv.bias"),
            proj_weight=matrix(b + "attn.proj.weight"), proj_bias=read(b + "attn.proj.bias"),
            norm2_weight=read(b + "norm2.weight"), norm2_bias=read(b + "norm2.bias"),
            fc1_weight=matrix(b + "mlp.linear_fc1.weight"), fc1_bias=read(b + "mlp.linear_fc1.bias"),
            fc2_weight=matrix(b + "mlp.linear_fc2.weight"), fc2_bias=read(b + "mlp.linear_fc2.bias"),
        )

    def merger(p: str, postshuffle: bool) -> PatchMerger:
        return PatchMerger(
            postshuffle=postshuffle, norm_weight=read(p + "norm.weight"), norm_bias=read(p + "norm.bias"),
            fc1_weight=matrix(p + "linear_fc1.weight"), fc1_bias=read(p + "linear_fc1.bias"),
            fc2_weight=matrix(p + "linear_fc2.weight"), fc2_bias=read(p + "linear_fc2.bias"),
        )

    return VisionWeights(
        patch_weight=matrix(prefix + "patch_embed.proj.weight", config.hidden_size),  # [hidden, C*T*P*P]
        patch_bias=read(prefix + "patch_embed.proj.bias"),  # [hidden]
        pos_embed=read(prefix + "pos_embed.weight"),  # [num_pos, hidden]
        blocks=tuple(block(i) for i in range(config.depth)),
        merger=merger(prefix + "merger.", False),
        deepstack_mergers=tuple(
            merger(f"{prefix}deepstack_merger_list.{j}.", True) for j in range(len(config.deepstack_visual_indexes))
        ),
    )


# --------------------------------------------------------------------------- math


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = _LAYER_NORM_EPS) -> np.ndarray:
    """LayerNorm over the last axis of ``x`` [..., d]."""
    mean = x.mean(axis=-1, keepdims=True)  # [..., 1]
    centered = x - mean  # [..., d]
    variance = np.mean(np.square(centered), axis=-1, keepdims=True)  # [..., 1]
    return centered / np.sqrt(variance + np.float32(eps)) * weight + bias  # [..., d]


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation ("gelu_pytorch_tanh")."""
    inner = x * x  # [...] in-place steps below: these arrays are the size of the MLP activations
    inner *= np.float32(0.044715)
    inner += np.float32(1.0)
    inner *= x
    inner *= np.float32(math.sqrt(2.0 / math.pi))  # sqrt(2/pi) * (x + 0.044715 x^3)
    np.tanh(inner, out=inner)
    inner += np.float32(1.0)
    inner *= x
    inner *= np.float32(0.5)
    return inner


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 in float64: |error| < 1.5e-7, at float32 rounding level.
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-z * z))


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x * Phi(x) (torch's nn.GELU())."""
    wide = x.astype(np.float64)  # same shape as x
    return (0.5 * wide * (1.0 + _erf(wide / math.sqrt(2.0)))).astype(np.float32)


_ACTIVATIONS = {"gelu_pytorch_tanh": gelu_tanh, "gelu": gelu_erf}


# --------------------------------------------------------------------------- layout


def _block_order(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of each patch of an h x w grid in merge-block order, each [h*w]."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")  # [h, w] each
    shape = (h // merge, merge, w // merge, merge)
    return rows.reshape(shape).transpose(0, 2, 1, 3).ravel(), cols.reshape(shape).transpose(0, 2, 1, 3).ravel()


def _axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear (align_corners) taps into a ``side`` table for positions ``index`` of ``size``: [n, 2] each."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))  # [n]
    floor = np.floor(src)  # [n]
    offsets = np.arange(2)  # floor, floor + 1
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)  # [n, 2]
    weights = np.maximum(np.float32(1) - np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32)), 0)  # [n, 2]
    return taps, weights.astype(np.float32)


def position_embedding(config: VisionConfig, pos_embed: np.ndarray, t: int, h: int, w: int) -> np.ndarray:
    """The learned positions resampled to an h x w grid, in merge-block order, repeated t times: [t*h*w, hidden]."""
    side = config.grid_side
    rows, cols = _block_order(h, w, config.spatial_merge_size)  # [h*w] each
    row_taps, row_weights = _axis_taps(rows, h, side)  # [h*w, 2] each
    col_taps, col_weights = _axis_taps(cols, w, side)  # [h*w, 2] each
    indices = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4)  # [h*w, 4]
    weights = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4)  # [h*w, 4]
    embeds = (pos_embed[indices] * weights[:, :, None]).sum(axis=1)  # [h*w, hidden]
    return np.tile(embeds, (t, 1))  # [t*h*w, hidden]


def rotary_cos_sin(config: VisionConfig, t: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """2-D rotary cos and sin, each [t*h*w, head_dim/2]: first half rotates by row, second by column."""
    quarter = config.head_dim // 2
    exponents = np.arange(0, quarter, 2, dtype=np.float32) / np.float32(quarter)  # [head_dim/4]
    inv_freq = (np.float32(1.0) / (np.float32(config.rope_theta) ** exponents)).astype(np.float32)  # [head_dim/4]
    rows, cols = _block_order(h, w, config.spatial_merge_size)  # [h*w] each
    angles = np.concatenate(
        [rows.astype(np.float32)[:, None] * inv_freq, cols.astype(np.float32)[:, None] * inv_freq], axis=-1
    )  # [h*w, head_dim/2]
    angles = np.tile(angles, (t, 1))  # [t*h*w, head_dim/2]
    return np.cos(angles), np.sin(angles)


# --------------------------------------------------------------------------- forward


def _attention(config: VisionConfig, block: VisionBlock, x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
               frame_len: int) -> np.ndarray:
    n = x.shape[0]
    heads, head_dim = config.num_heads, config.head_dim
    qkv = linear(x, block.qkv_weight, block.qkv_bias).reshape(n, 3, heads, head_dim)  # [N, 3, heads, head_dim]
    q = apply_rope(qkv[:, 0], cos, sin)  # [N, heads, head_dim]
    k = apply_rope(qkv[:, 1], cos, sin)  # [N, heads, head_dim]
    v = qkv[:, 2]  # [N, heads, head_dim]
    out = np.empty((n, heads * head_dim), dtype=np.float32)  # [N, hidden]
    scale = np.float32(head_dim**-0.5)
    for start in range(0, n, frame_len):  # each frame attends only to itself
        rows = slice(start, start + frame_len)
        # Contiguous [heads, L, head_dim] stacks keep the batched matmuls on BLAS.
        qh = np.ascontiguousarray(q[rows].transpose(1, 0, 2))  # [heads, L, head_dim]
        kh = np.ascontiguousarray(k[rows].transpose(1, 0, 2))  # [heads, L, head_dim]
        vh = np.ascontiguousarray(v[rows].transpose(1, 0, 2))  # [heads, L, head_dim]
        scores = qh @ kh.transpose(0, 2, 1)  # [heads, L, L]
        scores *= scale
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out[rows] = (scores @ vh).transpose(1, 0, 2).reshape(frame_len, -1)  # [L, hidden]
    return linear(out, block.proj_weight, block.proj_bias)  # [N, hidden]


def _block(config: VisionConfig, block: VisionBlock, x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
           frame_len: int) -> np.ndarray:
    act = _ACTIVATIONS[config.hidden_act]
    h = layer_norm(x, block.norm1_weight, block.norm1_bias)  # [N, hidden]
    x = x + _attention(config, block, h, cos, sin, frame_len)  # [N, hidden]
    h = layer_norm(x, block.norm2_weight, block.norm2_bias)  # [N, hidden]
    h = act(linear(h, block.fc1_weight, block.fc1_bias))  # [N, inter]
    return x + linear(h, block.fc2_weight, block.fc2_bias)  # [N, hidden]


def merge_patches(merger: PatchMerger, x: np.ndarray, merged_size: int) -> np.ndarray:
    """Fold each run of merge^2 patch rows [N, hidden] into one token: [N/merge^2, out_hidden]."""
    if merger.postshuffle:
        h = layer_norm(x.reshape(-1, merged_size), merger.norm_weight, merger.norm_bias)  # [N/m^2, hidden*m^2]
    else:
        h = layer_norm(x, merger.norm_weight, merger.norm_bias).reshape(-1, merged_size)  # [N/m^2, hidden*m^2]
    h = gelu_erf(linear(h, merger.fc1_weight, merger.fc1_bias))  # [N/m^2, hidden*m^2]
    return linear(h, merger.fc2_weight, merger.fc2_bias)  # [N/m^2, out_hidden]


def _encode_one(config: VisionConfig, weights: VisionWeights, pixels: np.ndarray, t: int, h: int, w: int
                ) -> Generator[None, None, tuple[np.ndarray, list[np.ndarray]]]:
    x = linear(pixels, weights.patch_weight, weights.patch_bias)  # [t*h*w, hidden]
    x += position_embedding(config, weights.pos_embed, t, h, w)  # [t*h*w, hidden]
    cos, sin = rotary_cos_sin(config, t, h, w)  # [t*h*w, head_dim/2] each
    deepstack = []
    for index, block in enumerate(weights.blocks):
        x = _block(config, block, x, cos, sin, h * w)  # [t*h*w, hidden]
        if index in config.deepstack_visual_indexes:
            merger = weights.deepstack_mergers[config.deepstack_visual_indexes.index(index)]
            deepstack.append(merge_patches(merger, x, config.merged_size))  # [t*h*w/m^2, out_hidden]
        yield  # a caller may stop here, between two blocks
    return merge_patches(weights.merger, x, config.merged_size), deepstack


def run_to_end(steps: Generator[None, None, T]) -> T:
    """Drive a stepwise computation to its end and return its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def encode_images(config: VisionConfig, weights: VisionWeights, pixel_values: np.ndarray,
                  grid_thw: np.ndarray) -> ImageFeatures:
    """Run the vision tower over the images of one prompt (see :func:`encode_images_steps`)."""
    return run_to_end(encode_images_steps(config, weights, pixel_values, grid_thw))


def encode_images_steps(config: VisionConfig, weights: VisionWeights, pixel_values: np.ndarray,
                        grid_thw: np.ndarray) -> Generator[None, None, ImageFeatures]:
    """Run the vision tower over the images of one prompt, yielding after each vision block.

    A driver advances it one block per call (``next``) and may stop between
    blocks, so an abandoned request costs at most one more block; the
    generator's return value is the result.

    Images are independent (attention never crosses an image or a frame), so
    each is encoded on its own and the results are concatenated in order.

    Args:
        config: the vision configuration.
        weights: the vision tower.
        pixel_values: float32 [sum(t*h*w), C*T*P*P] from the image processor.
        grid_thw: int [n_images, 3], each image's (frames, patch rows, patch columns).

    Returns:
        Embeddings and deepstack features, [sum(t*h*w) / merge^2, out_hidden] each.
    """
    pixels = np.asarray(pixel_values, dtype=np.float32)  # [n_patches, C*T*P*P]
    embeds, deepstack = [], [[] for _ in config.deepstack_visual_indexes]
    start = 0
    for t, h, w in np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3).tolist():
        one, layers = yield from _encode_one(config, weights, pixels[start : start + t * h * w], t, h, w)
        embeds.append(one)
        for store, feature in zip(deepstack, layers):
            store.append(feature)
        start += t * h * w
    empty = np.zeros((0, config.out_hidden_size), dtype=np.float32)  # [0, out_hidden]
    return ImageFeatures(
        embeds=np.concatenate(embeds) if embeds else empty,  # [n_tokens, out_hidden]
        deepstack=tuple(np.concatenate(s) if s else empty for s in deepstack),  # each [n_tokens, out_hidden]
    )
