"""Videos of a chat request: limits, locating, decoding and preprocessing, all before any engine work.

Theory of operation: the chat route calls :func:`prepare_videos` with the
validated messages. A video is a ``video_url`` part (an MP4 or WebM file,
inline as ``data:video/...;base64,`` or a ``file://`` URL under the folder
allowed for images) or a ``video`` part (its frames as a list of image URLs).
A first pass on the event loop counts the videos and classifies each URL
(nothing is decoded). A second pass, in a worker thread, decodes each file's
frames sampled at the server's rate (PyAV, :mod:`kestrel_trio.text.media.video_decode`)
or each listed frame (Pillow), and turns them into patches and timestamps
(:func:`kestrel_trio.text.media.videos.frames_to_video`). Every refusal is a
:class:`BadRequestError` whose ``param`` names the part. The chat route then
expands the template's video placeholders into per-frame timestamps and pads.

A list of frames carries no timing: its frames are taken as sampled at the
server's rate (``--video-fps``, else the model's), so frame ``i`` is at ``i / fps`` seconds.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import trio

from kestrel_trio.app.media.images import ImagePolicy, check_allowed_file, media_bytes
from kestrel_trio.errors import BadRequestError
from kestrel_trio.model import Model
from kestrel_trio.openai.request.image_urls import ImageRef, parse_image_url, video_parts
from kestrel_trio.text.media.images import decode_image
from kestrel_trio.text.media.video_decode import decode_video, require_av
from kestrel_trio.text.media.videos import ProcessedVideo, VideoProcessorConfig, frame_timestamps, frames_to_video

__all__ = ["VideoPolicy", "prepare_videos"]


def _positive_or_none(instance: object, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{attribute.name} must be positive, got {value!r}")


@attrs.frozen
class VideoPolicy:
    """What video input a server accepts (``file://`` URLs follow :attr:`ImagePolicy.allow_dir`).

    Attributes:
        fps: frames sampled per second of video (frames/s); None takes the model's video config (2 for Qwen3-VL).
        max_frames: most frames sampled from one video (fewer are spread over it), and most frames of a frame list.
        max_bytes: largest encoded video (bytes).
        max_pixels: largest frame, width * height (pixels), before any resize.
        max_source_frames: largest frame count of a video file (bounds the decoding work).
        max_videos: videos per request.
    """

    fps: float | None = attrs.field(default=None, validator=_positive_or_none)
    max_frames: int = attrs.field(default=32, validator=attrs.validators.ge(2))
    max_bytes: int = attrs.field(default=32 * 2**20, validator=attrs.validators.ge(1))
    max_pixels: int = attrs.field(default=1920 * 1088, validator=attrs.validators.ge(1))
    max_source_frames: int = attrs.field(default=3600, validator=attrs.validators.ge(1))
    max_videos: int = attrs.field(default=1, validator=attrs.validators.ge(0))


async def prepare_videos(model: Model, messages: tuple[dict, ...], policy: VideoPolicy, images: ImagePolicy,
                         limiter: trio.CapacityLimiter) -> list[ProcessedVideo]:
    """Check, read, decode and preprocess every video of validated chat ``messages``, in prompt order.

    Args:
        model: the served model (its ``video_config`` shapes the patches).
        messages: validated messages (see :func:`kestrel_trio.openai.parse_chat_request`).
        policy: the server's video limits.
        images: the server's image limits (a frame list's frames are images; ``file://`` folder).
        limiter: bounds how many requests decode media at once.

    Raises:
        BadRequestError: videos sent to a model that takes none, PyAV missing for a video file, too many
            videos or frames, a refused URL or file, or a video that is corrupt, unsupported or over a limit;
            ``param`` names the part.
    """
    found = video_parts(messages)
    if not found:
        return []
    first = found[0][0]
    if model.vision is None or model.video_config is None:
        raise BadRequestError(f"'{first}': model {model.name!r} does not accept videos", param=first)
    if len(found) > policy.max_videos:
        param = found[policy.max_videos][0]
        raise BadRequestError(f"'{param}': at most {policy.max_videos} videos per request are accepted on this "
                              f"server, got {len(found)}", param=param, code="too_many_videos")
    sources: list[ImageRef | list[ImageRef]] = []
    for param, source in found:
        if isinstance(source, str):
            require_av(param)  # a clear 400 before anything is read
            ref = parse_image_url(source, param, max_bytes=policy.max_bytes, media="video")
            sources.append(ref)
            refs = [ref]
        else:
            if len(source) > policy.max_frames:
                raise BadRequestError(f"'{param}': at most {policy.max_frames} frames per video are accepted on "
                                      f"this server, got {len(source)}", param=param, code="too_many_frames")
            refs = [parse_image_url(url, f"{param}[{k}]", max_bytes=images.max_bytes) for k, url in enumerate(source)]
            sources.append(refs)
        for ref in refs:
            if ref.file_path is not None:
                check_allowed_file(ref, images.allow_dir, "image" if isinstance(source, list) else "video")
    return await trio.to_thread.run_sync(_preprocess_all, model.video_config, sources, policy, images,
                                         limiter=limiter)


def _preprocess_all(config: VideoProcessorConfig, sources: list, policy: VideoPolicy,
                    images: ImagePolicy) -> list[ProcessedVideo]:
    return [_from_file(config, s, policy, images.allow_dir) if isinstance(s, ImageRef)
            else _from_frames(config, s, policy, images) for s in sources]


def _from_file(config: VideoProcessorConfig, ref: ImageRef, policy: VideoPolicy,
               allow_dir: Path | None) -> ProcessedVideo:
    data = media_bytes(ref, allow_dir, policy.max_bytes, "video")
    if len(data) > policy.max_bytes:
        raise BadRequestError(f"'{ref.param}': the video is {len(data)} bytes, the limit is {policy.max_bytes}",
                              param=ref.param, code="video_too_large")
    if not data:
        raise BadRequestError(f"'{ref.param}': the video data is empty", param=ref.param)
    decoded = decode_video(data, fps=policy.fps or config.fps, min_frames=config.min_frames,
                           max_frames=min(config.max_frames, policy.max_frames), max_pixels=policy.max_pixels,
                           max_source_frames=policy.max_source_frames, param=ref.param)
    stamps = frame_timestamps(decoded.indices, decoded.fps, config.pixels.temporal_patch_size)
    return frames_to_video(decoded.frames, stamps, config, param=ref.param)


def _from_frames(config: VideoProcessorConfig, refs: list[ImageRef], policy: VideoPolicy,
                 images: ImagePolicy) -> ProcessedVideo:
    param = refs[0].param.rsplit("[", 1)[0]
    frames = []
    for ref in refs:
        data = media_bytes(ref, images.allow_dir, images.max_bytes)
        frame = np.asarray(decode_image(data, max_bytes=images.max_bytes, max_pixels=images.max_pixels,
                                        param=ref.param))  # [H, W, 3] uint8
        if frames and frame.shape != frames[0].shape:
            raise BadRequestError(f"'{ref.param}': frame is {frame.shape[1]}x{frame.shape[0]} pixels but the first "
                                  f"frame is {frames[0].shape[1]}x{frames[0].shape[0]}; a video's frames share "
                                  "one size", param=ref.param)
        frames.append(frame)
    stamps = frame_timestamps(range(len(frames)), policy.fps or config.fps, config.pixels.temporal_patch_size)
    return frames_to_video(np.stack(frames), stamps, config, param=param)  # frames [n, H, W, 3]
