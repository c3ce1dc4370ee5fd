"""Video preprocessing for Qwen3-VL, equal to transformers' Qwen3-VL video processor and processor.

Theory of operation: a video arrives as decoded RGB frames (from PyAV, see
:mod:`kestrel_trio.text.media.video_decode`, or as a client's list of images).
Frames of a decoded video are first sampled at the requested rate
(:func:`sample_indices`, transformers' ``Qwen3VLVideoProcessor.sample_frames``).
All frames are then resized to one size whose sides are multiples of
patch_size * merge_size and whose area *summed over the frames* lies within
the config's pixel bounds (:func:`video_smart_resize`), rescaled and
normalised (:func:`frames_to_video`), and cut into patches: each patch row
holds C x T x P x P values of T consecutive frames (temporal_patch_size, the
last frame repeated when the count is odd), rows in merge-block order within
each temporal patch. In the prompt, the chat template's
``<|vision_start|><|video_pad|><|vision_end|>`` becomes, per temporal patch,
``<t seconds>`` (the mean time of its frames, one decimal) followed by
``<|vision_start|>``, h*w/merge^2 ``<|video_pad|>`` and ``<|vision_end|>``
(:func:`expand_video_placeholders`, ``Qwen3VLProcessor.replace_video_token``).

Frames are resized as torch's x86 kernel resizes them for transformers
(:mod:`kestrel_trio.text.media.frame_resize`, bit for bit); the config's ``resample``
must then be bicubic, the filter Qwen3-VL's configs name.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import attrs
import numpy as np

from kestrel_trio._model import read_json_object
from kestrel_trio.errors import BadRequestError, ModelLoadError
from kestrel_trio.text.media.frame_resize import resize_bicubic_uint8
from kestrel_trio.text.media.images import ImageProcessorConfig

__all__ = [
    "VideoProcessorConfig", "ProcessedVideo", "sample_indices", "video_smart_resize", "frame_timestamps",
    "frames_to_video", "video_placeholder", "expand_video_placeholders", "VIDEO_PAD", "VISION_START", "VISION_END",
]

VIDEO_PAD = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
_MAX_ASPECT_RATIO = 200
_BICUBIC = 3  # PIL.Image.Resampling.BICUBIC

# Qwen3VLVideoProcessor's class defaults (transformers 5.25), which a config file's fields override.
_VIDEO_DEFAULTS: dict[str, Any] = {
    "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],  # IMAGENET_STANDARD_MEAN / _STD
}


@attrs.frozen
class VideoProcessorConfig:
    """The fields of video_preprocessor_config.json that shape a video's pixel_values and prompt.

    Attributes:
        pixels: the per-frame fields shared with images; ``min_pixels`` / ``max_pixels`` bound the
            resized area summed over all sampled frames (frames * height * width, pixels).
        fps: frames sampled per second of video unless the server asks otherwise (frames/s).
        min_frames: fewest frames sampled from a video (when it has that many).
        max_frames: most frames sampled from a video.
    """

    pixels: ImageProcessorConfig
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, source: str) -> VideoProcessorConfig:
        """Parse a (video_)preprocessor_config.json dict over Qwen3VLVideoProcessor's defaults.

        Raises:
            ModelLoadError: a field has the wrong type or value.
        """
        pixels = ImageProcessorConfig.from_dict({**_VIDEO_DEFAULTS, **raw}, source=source)
        fps = raw.get("fps", 2)
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
            raise ModelLoadError(f"{source}: field 'fps' must be a positive number, got {fps!r}")
        counts = {k: raw.get(k, d) for k, d in (("min_frames", 4), ("max_frames", 768))}
        for name, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(f"{source}: field {name!r} must be a positive integer, got {value!r}")
        return cls(pixels=pixels, fps=float(fps), **counts)

    @classmethod
    def read(cls, folder: str | Path) -> VideoProcessorConfig:
        """``folder/video_preprocessor_config.json``, else ``preprocessor_config.json`` as transformers falls back.

        Raises:
            ModelLoadError: the file is missing, unreadable or wrong.
        """
        path = Path(folder) / "video_preprocessor_config.json"
        if not path.is_file():
            path = Path(folder) / "preprocessor_config.json"
        return cls.from_dict(read_json_object(path, "a vision checkpoint needs preprocessor_config.json"),
                             source=str(path))


@attrs.frozen
class ProcessedVideo:
    """One video ready for the vision tower.

    Attributes:
        pixel_values: float32 [t*h*w, C*T*P*P], temporal patches in order, rows in merge-block order.
        grid_thw: (temporal patches, patch rows, patch columns).
        merge_size: patches per side of one language-model token.
        timestamps: the time of each temporal patch (seconds), as the prompt shows it.
    """

    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    merge_size: int
    timestamps: tuple[float, ...]

    @property
    def num_tokens(self) -> int:
        """``<|video_pad|>`` tokens this video takes in the prompt (all temporal patches)."""
        t, h, w = self.grid_thw
        return t * h * w // self.merge_size**2


def sample_indices(total_frames: int, video_fps: float, fps: float, *, min_frames: int, max_frames: int) -> np.ndarray:
    """Which frames of a video to keep: ``fps`` per second, evenly spread (``sample_frames``).

    Args:
        total_frames: frames in the video (its header's count).
        video_fps: the video's frame rate (frames/s).
        fps: frames wanted per second of video (frames/s).
        min_frames: fewest frames to keep (unless the video has fewer).
        max_frames: most frames to keep.

    Returns:
        int64 [n] ascending frame indices.
    """
    wanted = int(total_frames / video_fps * fps)
    count = min(max(wanted, min_frames), max_frames, total_frames)
    return np.linspace(0, total_frames - 1, count).round().astype(np.int64)  # [n]


def video_smart_resize(num_frames: int, height: int, width: int, *, temporal_factor: int, factor: int,
                       min_pixels: int, max_pixels: int, param: str) -> tuple[int, int]:
    """The video processor's frame size: sides multiples of ``factor``, frames * area in [min_pixels, max_pixels].

    Args:
        num_frames: sampled frames (before temporal padding).
        height: source height (pixels).
        width: source width (pixels).
        temporal_factor: temporal_patch_size (frames).
        factor: patch_size * merge_size (pixels).
        min_pixels: smallest frames * height * width (pixels).
        max_pixels: largest frames * height * width (pixels).
        param: the request field named in errors.

    Returns:
        (height, width) in pixels.

    Raises:
        BadRequestError: fewer frames than temporal_factor, or an aspect ratio over 200:1.
    """
    if num_frames < temporal_factor:
        raise BadRequestError(f"'{param}': a video needs at least {temporal_factor} frames, got {num_frames}",
                              param=param)
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > _MAX_ASPECT_RATIO:
        raise BadRequestError(f"'{param}': video aspect ratio {max(height, width) / min(height, width):.0f}:1 "
                              f"exceeds {_MAX_ASPECT_RATIO}:1", param=param)
    h_bar = round(height / factor) * factor  # Python rounds half to even, as the reference does
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def frame_timestamps(indices: Sequence[int], video_fps: float, temporal_patch_size: int) -> tuple[float, ...]:
    """Each temporal patch's time (seconds): the mean of its first and last frame's (``_calculate_timestamps``).

    Args:
        indices: the sampled frames' indices in the video.
        video_fps: the video's frame rate (frames/s).
        temporal_patch_size: frames per temporal patch; a short last patch repeats its last frame.
    """
    padded = list(int(i) for i in indices)
    if len(padded) % temporal_patch_size:
        padded.extend(padded[-1] for _ in range(temporal_patch_size - len(padded) % temporal_patch_size))
    times = [i / video_fps for i in padded]
    return tuple((times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size))


def frames_to_video(frames: np.ndarray, timestamps: Sequence[float], config: VideoProcessorConfig, *,
                    param: str) -> ProcessedVideo:
    """Resize, normalise and patch sampled frames (``Qwen3VLVideoProcessor._preprocess``).

    Args:
        frames: uint8 [n, H, W, 3] RGB, the sampled frames in order.
        timestamps: :func:`frame_timestamps` of those frames.
        config: the checkpoint's video processor config.
        param: the request field named in errors.

    Raises:
        BadRequestError: too few frames, an extreme aspect ratio, or sides that are not multiples of
            patch_size * merge_size when the config turns resizing off.
    """
    c = config.pixels
    n, height, width = frames.shape[:3]
    if c.do_resize:
        height, width = video_smart_resize(n, height, width, temporal_factor=c.temporal_patch_size, factor=c.factor,
                                           min_pixels=c.min_pixels, max_pixels=c.max_pixels, param=param)
        frames = _resize(frames, height, width, c.resample, param)  # [n, h, w, 3]
    elif n < c.temporal_patch_size or height % c.factor or width % c.factor:
        raise BadRequestError(f"'{param}': with do_resize false a video needs {c.temporal_patch_size}+ frames whose "
                              f"sides are multiples of {c.factor} pixels", param=param)
    values = frames.transpose(0, 3, 1, 2).astype(np.float32)  # [n, 3, h, w]
    values = _rescale_and_normalize(values, c)  # [n, 3, h, w]
    return _patchify(values, c, tuple(timestamps))


def _resize(frames: np.ndarray, height: int, width: int, resample: int, param: str) -> np.ndarray:
    if resample != _BICUBIC:
        raise BadRequestError(f"'{param}': videos are resized bicubic only; the model's config names resample "
                              f"{resample}", param=param)
    return resize_bicubic_uint8(frames, height, width)  # [n, h, w, 3] uint8


def _rescale_and_normalize(values: np.ndarray, c: ImageProcessorConfig) -> np.ndarray:
    """transformers' fused rescale + normalise: (x - mean/scale) / (std/scale), float32 throughout."""
    if c.do_normalize:
        scale = np.float32(1.0 / c.rescale_factor) if c.do_rescale else np.float32(1.0)
        mean = (np.asarray(c.image_mean, dtype=np.float32) * scale)[None, :, None, None]  # [1, 3, 1, 1]
        std = (np.asarray(c.image_std, dtype=np.float32) * scale)[None, :, None, None]  # [1, 3, 1, 1]
        return (values - mean) / std  # [n, 3, h, w]
    if c.do_rescale:
        return values * np.float32(c.rescale_factor)  # [n, 3, h, w]
    return values


def _patchify(values: np.ndarray, c: ImageProcessorConfig, timestamps: tuple[float, ...]) -> ProcessedVideo:
    p, m, t = c.patch_size, c.merge_size, c.temporal_patch_size
    if pad := -values.shape[0] % t:
        values = np.concatenate([values, np.repeat(values[-1:], pad, axis=0)])  # [n + pad, 3, h, w]
    n, channels, height, width = values.shape
    grid_t, grid_h, grid_w = n // t, height // p, width // p
    blocks = values.reshape(grid_t, t, channels, grid_h // m, m, p, grid_w // m, m, p)  # [gt, T, C, gh/m, m, P, ...]
    blocks = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # [gt, gh/m, gw/m, m, m, C, T, P, P]
    pixel_values = blocks.reshape(grid_t * grid_h * grid_w, channels * t * p * p)  # [gt*gh*gw, C*T*P*P]
    if len(timestamps) != grid_t:
        raise ValueError(f"{len(timestamps)} timestamps for {grid_t} temporal patches")
    return ProcessedVideo(pixel_values=np.ascontiguousarray(pixel_values, dtype=np.float32),
                          grid_thw=(grid_t, grid_h, grid_w), merge_size=m, timestamps=timestamps)


def video_placeholder(video: ProcessedVideo) -> str:
    """The prompt text of one video: per temporal patch, ``<t seconds>`` and its vision-wrapped pads."""
    _, h, w = video.grid_thw
    pads = VIDEO_PAD * (h * w // video.merge_size**2)
    return "".join(f"<{t:.1f} seconds>{VISION_START}{pads}{VISION_END}" for t in video.timestamps)


def expand_video_placeholders(prompt: str, videos: Sequence[ProcessedVideo]) -> str:
    """``prompt`` with its i-th video placeholder replaced by :func:`video_placeholder` of ``videos[i]``.

    A placeholder is the chat template's ``<|vision_start|><|video_pad|><|vision_end|>`` (the wrapper is
    dropped, each frame carries its own), else a bare ``<|video_pad|>``, as Qwen3VLProcessor replaces them.

    Raises:
        BadRequestError: the prompt's placeholder count differs from the number of videos (e.g. a chat
            template that does not render video parts).
    """
    if not videos:
        return prompt
    wrapper = VISION_START + VIDEO_PAD + VISION_END
    found = prompt.count(VIDEO_PAD)
    if found != len(videos):
        raise BadRequestError(f"the prompt has {found} video placeholders but {len(videos)} videos were given "
                              "(does the model's chat template render video parts?)", param="messages")
    out, rest = [], prompt
    for video in videos:
        at = rest.index(VIDEO_PAD)
        wrapped = at >= len(VISION_START) and rest.startswith(wrapper, at - len(VISION_START))
        start = at - len(VISION_START) if wrapped else at
        end = at + len(VIDEO_PAD) + (len(VISION_END) if wrapped else 0)
        out.append(rest[:start] + video_placeholder(video))
        rest = rest[end:]
    return "".join(out) + rest
