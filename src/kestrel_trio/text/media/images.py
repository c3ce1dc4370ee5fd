"""Image preprocessing for Qwen-VL, equal to transformers' Qwen2-VL image processor.

Theory of operation: an image arrives as encoded bytes (PNG, JPEG or WebP).
It is checked against byte and pixel limits before any pixel is decoded,
decoded with Pillow, turned into RGB (transparency composited onto white),
resized with bicubic filtering to the nearest size whose sides are multiples
of patch_size * merge_size and whose area lies within min/max pixels
(``smart_resize``), scaled to [0, 1], normalised with the checkpoint's mean
and std, and cut into patches. Each patch row holds C x T x P x P values (the
single frame repeated T times), and rows come in merge-block order: every
merge^2 consecutive rows form one square that the vision tower folds into one
language-model token. A prompt's ``<|image_pad|>`` is then expanded to that
many tokens.

Pillow is imported on first use only: it belongs to the optional ``vision``
extra, and text-only servers never need it.
"""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path
from typing import Any, Sequence

import attrs
import numpy as np

from kestrel_trio._model import read_json_object
from kestrel_trio.errors import BadRequestError, KestrelError, ModelLoadError

__all__ = [
    "ImageProcessorConfig", "ProcessedImage", "smart_resize", "decode_image", "preprocess_image",
    "expand_image_pads", "require_pillow",
]

SUPPORTED_FORMATS = ("PNG", "JPEG", "WEBP")
_BICUBIC = 3  # PIL.Image.Resampling.BICUBIC, the processor's default
_MAX_ASPECT_RATIO = 200  # smart_resize refuses longer strips


@attrs.frozen
class ImageProcessorConfig:
    """The fields of preprocessor_config.json that shape pixel_values.

    Attributes:
        min_pixels: smallest resized area (pixels); ``size.shortest_edge`` in the file.
        max_pixels: largest resized area (pixels); ``size.longest_edge`` in the file.
        patch_size: patch side (pixels).
        temporal_patch_size: frames per patch.
        merge_size: patches per side of one language-model token.
        image_mean: per-channel mean (R, G, B) on the [0, 1] scale.
        image_std: per-channel std (R, G, B).
        rescale_factor: multiplier taking uint8 values to [0, 1].
        resample: Pillow filter id for resizing (3 = bicubic).
        do_resize: resize at all.
        do_rescale: apply rescale_factor.
        do_normalize: apply mean and std.
    """

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
    rescale_factor: float = 1 / 255
    resample: int = _BICUBIC
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this (pixels)."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, source: str = "preprocessor_config.json") -> ImageProcessorConfig:
        """Parse a preprocessor_config.json dict; ``size`` wins over legacy ``min_pixels``/``max_pixels``.

        Raises:
            ModelLoadError: a field has the wrong type or value.
        """
        d = cls()
        size = raw.get("size") if isinstance(raw.get("size"), dict) else {}
        values = {
            "min_pixels": size.get("shortest_edge", raw.get("min_pixels", d.min_pixels)),
            "max_pixels": size.get("longest_edge", raw.get("max_pixels", d.max_pixels)),
            **{k: raw.get(k, getattr(d, k)) for k in ("patch_size", "temporal_patch_size", "merge_size", "resample")},
        }
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "resample" else 1):
                raise ModelLoadError(f"{source}: field {name!r} must be a positive integer, got {value!r}")
        stats = {k: raw.get(k, getattr(d, k)) for k in ("image_mean", "image_std")}
        for name, value in stats.items():
            if not isinstance(value, (list, tuple)) or len(value) != 3 or not all(isinstance(v, (int, float)) for v in value):
                raise ModelLoadError(f"{source}: field {name!r} must be 3 numbers, got {value!r}")
        if any(v <= 0 for v in stats["image_std"]):
            raise ModelLoadError(f"{source}: image_std must be positive")
        rescale = raw.get("rescale_factor", d.rescale_factor)
        if not isinstance(rescale, (int, float)) or isinstance(rescale, bool):
            raise ModelLoadError(f"{source}: field 'rescale_factor' must be a number, got {rescale!r}")
        if values["min_pixels"] > values["max_pixels"]:
            raise ModelLoadError(f"{source}: min pixels {values['min_pixels']} exceed max pixels {values['max_pixels']}")
        flags = {k: bool(raw.get(k, getattr(d, k))) for k in ("do_resize", "do_rescale", "do_normalize")}
        return cls(**values, image_mean=tuple(map(float, stats["image_mean"])),
                   image_std=tuple(map(float, stats["image_std"])), rescale_factor=float(rescale), **flags)

    @classmethod
    def read(cls, folder: str | Path) -> ImageProcessorConfig:
        """Read ``folder/preprocessor_config.json``.

        Raises:
            ModelLoadError: the file is missing, unreadable or wrong.
        """
        path = Path(folder) / "preprocessor_config.json"
        raw = read_json_object(path, "a vision checkpoint needs preprocessor_config.json")
        return cls.from_dict(raw, source=str(path))


@attrs.frozen
class ProcessedImage:
    """One image ready for the vision tower.

    Attributes:
        pixel_values: float32 [t*h*w, C*T*P*P], rows in merge-block order.
        grid_thw: (frames, patch rows, patch columns); frames is 1 for an image.
        merge_size: patches per side of one language-model token.
    """

    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    merge_size: int

    @property
    def num_tokens(self) -> int:
        """``<|image_pad|>`` tokens this image takes in the prompt."""
        t, h, w = self.grid_thw
        return t * h * w // self.merge_size**2


def require_pillow() -> Any:
    """The ``PIL.Image`` module, or KestrelError saying how to install it."""
    try:
        import PIL.Image
        import PIL.ImageOps  # decode_image applies exif_transpose
    except ImportError:
        raise KestrelError(
            "image input needs Pillow, which is not installed; install it with: pip install 'kestrel-trio[vision]'",
            code="missing_dependency",
        ) from None
    return PIL.Image


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The processor's target size: sides multiples of ``factor``, area in [min_pixels, max_pixels].

    Args:
        height: source height (pixels).
        width: source width (pixels).
        factor: patch_size * merge_size (pixels).
        min_pixels: smallest area (pixels).
        max_pixels: largest area (pixels).

    Returns:
        (height, width) in pixels, keeping the aspect ratio as well as the grid allows.

    Raises:
        BadRequestError: the image is more than 200 times longer than wide (or the reverse).
    """
    if max(height, width) / min(height, width) > _MAX_ASPECT_RATIO:
        raise BadRequestError(
            f"image aspect ratio {max(height, width) / min(height, width):.0f}:1 exceeds {_MAX_ASPECT_RATIO}:1",
            param="messages",
        )
    h_bar = round(height / factor) * factor  # Python rounds half to even, as the reference does
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def decode_image(data: bytes, *, max_bytes: int, max_pixels: int, param: str = "messages") -> Any:
    """Decode PNG, JPEG or WebP ``data`` into an RGB Pillow image.

    Args:
        data: the encoded image.
        max_bytes: largest accepted encoding (bytes).
        max_pixels: largest accepted width * height of the decoded image (pixels);
            checked from the header, before the pixels are decoded.
        param: the request field named in errors.

    Raises:
        BadRequestError: too large, not an image, an unsupported format, or corrupt.
        KestrelError: Pillow is not installed.
    """
    image_module = require_pillow()
    if len(data) > max_bytes:
        raise BadRequestError(f"image is {len(data)} bytes, the limit is {max_bytes}", param=param)
    if not data:
        raise BadRequestError("image data is empty", param=param)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", image_module.DecompressionBombWarning)
            image = image_module.open(io.BytesIO(data), formats=SUPPORTED_FORMATS)
            width, height = image.size
            if width * height > max_pixels:
                raise BadRequestError(f"image is {width}x{height} pixels, the limit is {max_pixels} pixels", param=param)
            image.load()
    except BadRequestError:
        raise
    except image_module.UnidentifiedImageError:
        raise BadRequestError(
            f"image data is not a supported image (supported: {', '.join(SUPPORTED_FORMATS)})", param=param
        ) from None
    except (image_module.DecompressionBombError, image_module.DecompressionBombWarning):
        raise BadRequestError("image is too large to decode", param=param) from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise BadRequestError(f"image data is corrupt: {exc}", param=param) from None
    return _to_rgb(_upright(image))


def _upright(image: Any) -> Any:
    # transformers' load_image applies the EXIF orientation before processing.
    import PIL.ImageOps

    return PIL.ImageOps.exif_transpose(image)


def _to_rgb(image: Any) -> Any:
    import PIL.Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = PIL.Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return PIL.Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def preprocess_image(data: bytes, config: ImageProcessorConfig, *, max_bytes: int, max_pixels: int,
                     param: str = "messages") -> ProcessedImage:
    """Decode ``data`` and turn it into the vision tower's patches, as transformers' processor does.

    Args:
        data: PNG, JPEG or WebP bytes.
        config: the checkpoint's preprocessor_config.json.
        max_bytes: largest accepted encoding (bytes).
        max_pixels: largest accepted decoded width * height (pixels).
        param: the request field named in errors.

    Raises:
        BadRequestError: see :func:`decode_image`, or an extreme aspect ratio.
    """
    image = decode_image(data, max_bytes=max_bytes, max_pixels=max_pixels, param=param)
    c = config
    if c.do_resize:
        height, width = smart_resize(image.height, image.width, c.factor, c.min_pixels, c.max_pixels)
        image = image.resize((width, height), resample=c.resample)
    pixels = np.asarray(image).transpose(2, 0, 1)  # [3, H, W] uint8
    if pixels.shape[1] % c.factor or pixels.shape[2] % c.factor:
        raise BadRequestError(f"image sides must be multiples of {c.factor} pixels when do_resize is false", param=param)
    values = pixels.astype(np.float32)  # [3, H, W]
    if c.do_rescale:
        values = (pixels.astype(np.float64) * c.rescale_factor).astype(np.float32)  # [3, H, W], as the reference rounds
    if c.do_normalize:
        mean = np.asarray(c.image_mean, dtype=np.float32)[:, None, None]  # [3, 1, 1]
        std = np.asarray(c.image_std, dtype=np.float32)[:, None, None]  # [3, 1, 1]
        values = (values - mean) / std  # [3, H, W]
    return _patchify(values, c)


def _patchify(values: np.ndarray, c: ImageProcessorConfig) -> ProcessedImage:
    channels, height, width = values.shape
    p, m, t = c.patch_size, c.merge_size, c.temporal_patch_size
    grid_h, grid_w = height // p, width // p
    blocks = values.reshape(channels, grid_h // m, m, p, grid_w // m, m, p)  # [C, gh/m, m, P, gw/m, m, P]
    blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, P, P]
    frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))  # [.., C, T, P, P]
    pixel_values = frames.reshape(grid_h * grid_w, channels * t * p * p)  # [gh*gw, C*T*P*P]
    return ProcessedImage(pixel_values=np.ascontiguousarray(pixel_values, dtype=np.float32),
                          grid_thw=(1, grid_h, grid_w), merge_size=m)


def expand_image_pads(token_ids: Sequence[int], image_token_id: int, token_counts: Sequence[int]) -> list[int]:
    """Replace the i-th ``<|image_pad|>`` of ``token_ids`` by ``token_counts[i]`` of them.

    Args:
        token_ids: the rendered prompt's ids, one pad per image.
        image_token_id: the ``<|image_pad|>`` id.
        token_counts: :attr:`ProcessedImage.num_tokens` of each image, in prompt order.

    Raises:
        BadRequestError: the prompt's pad count differs from the number of images.
    """
    pads = sum(1 for token in token_ids if token == image_token_id)
    if pads != len(token_counts):
        raise BadRequestError(
            f"the prompt has {pads} image placeholders but {len(token_counts)} images were given", param="messages"
        )
    out: list[int] = []
    counts = iter(token_counts)
    for token in token_ids:
        out.extend([token] * next(counts) if token == image_token_id else [token])
    return out
