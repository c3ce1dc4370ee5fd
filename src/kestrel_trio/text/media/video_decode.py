"""Decoding a video file's sampled frames with PyAV, every refusal a 400 naming the request part.

Theory of operation: the container is recognised from its first bytes (MP4 /
QuickTime, Matroska / WebM) and opened with that demuxer forced, so FFmpeg
never probes for playlist or concatenation formats that could open other
files. The first video stream's header gives the frame count, frame rate and
frame size, which are checked against the limits before any frame is
decoded (a header without a frame count, as WebM files usually are, has its
video packets counted instead, a demux without decoding); the frames to keep are chosen as transformers' Qwen3-VL video
processor chooses them (:func:`kestrel_trio.text.media.videos.sample_indices`), and
decoding stops after the last one. Frames become RGB with FFmpeg's own
converter, as transformers' PyAV reader does (``frame.to_ndarray(format="rgb24")``).

PyAV is imported on first use only: it belongs to the optional ``video`` extra.
"""

from __future__ import annotations

import io
from typing import Any

import attrs
import numpy as np

from kestrel_trio.errors import BadRequestError
from kestrel_trio.text.media.videos import sample_indices

__all__ = ["DecodedVideo", "decode_video", "require_av", "VIDEO_CODECS"]

# Codecs of phone, browser and camera clips; FFmpeg's decoders for them are mature.
VIDEO_CODECS = ("h264", "hevc", "vp8", "vp9", "av1", "mpeg4", "mjpeg")


@attrs.frozen
class DecodedVideo:
    """The sampled frames of a video.

    Attributes:
        frames: uint8 [n, H, W, 3] RGB.
        indices: int64 [n], each frame's index in the video.
        fps: the video's frame rate (frames/s).
    """

    frames: np.ndarray
    indices: np.ndarray
    fps: float


def require_av(param: str) -> Any:
    """The ``av`` module, or a 400 naming ``param`` saying how to install it."""
    try:
        import av
    except ImportError:
        raise BadRequestError(f"'{param}': video input needs PyAV, which is not installed on this server; "
                              "install it with: pip install 'kestrel-trio[video]'", param=param,
                              code="video_not_supported") from None
    return av


def _container_format(data: bytes, param: str) -> str:
    if data[4:8] == b"ftyp":
        return "mp4"  # FFmpeg's mov,mp4,m4a,3gp,3g2,mj2 demuxer
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"  # also WebM
    raise BadRequestError(f"'{param}': not a supported video container (supported: MP4/QuickTime, WebM/Matroska)",
                          param=param, code="unsupported_video")


def decode_video(data: bytes, *, fps: float, min_frames: int, max_frames: int, max_pixels: int,
                 max_source_frames: int, param: str) -> DecodedVideo:
    """Decode the frames of ``data`` sampled at ``fps``.

    Args:
        data: the encoded video file.
        fps: frames to keep per second of video (frames/s).
        min_frames: fewest frames to keep (unless the video has fewer).
        max_frames: most frames to keep.
        max_pixels: largest accepted frame width * height (pixels), checked from the header.
        max_source_frames: largest accepted frame count of the whole video (decoding cost is bounded by it).
        param: the request field named in errors.

    Raises:
        BadRequestError: PyAV missing, an unsupported container or codec, no video stream, a header without
            frame count or rate, a limit exceeded, or a corrupt or truncated stream.
    """
    av = require_av(param)
    container_format = _container_format(data, param)
    try:
        container = av.open(io.BytesIO(data), mode="r", format=container_format)
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise BadRequestError(f"'{param}': the video cannot be opened ({_reason(exc)})", param=param,
                              code="unsupported_video") from None
    with container:
        if not container.streams.video:
            raise BadRequestError(f"'{param}': the file has no video stream", param=param, code="unsupported_video")
        stream = container.streams.video[0]
        _check_stream(stream, max_pixels, max_source_frames, param)
        total = int(stream.frames) or _count_packets(container, stream, max_source_frames, param)
        rate = float(stream.average_rate)
        indices = sample_indices(total, rate, fps, min_frames=min_frames, max_frames=max_frames)  # [n]
        frames = _decode(container, stream, indices, param)
    return DecodedVideo(frames=frames, indices=indices, fps=rate)


def _reason(exc: Exception) -> str:
    """FFmpeg's own words for an error (``Invalid data found when processing input``), without errno noise."""
    return getattr(exc, "strerror", None) or str(exc)


def _check_stream(stream: Any, max_pixels: int, max_source_frames: int, param: str) -> None:
    codec = stream.codec_context.name
    if codec not in VIDEO_CODECS:
        raise BadRequestError(f"'{param}': video codec {codec!r} is not accepted (accepted: {', '.join(VIDEO_CODECS)})",
                              param=param, code="unsupported_video")
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > max_pixels:
        raise BadRequestError(f"'{param}': video frames are {width}x{height} pixels, the limit is {max_pixels} "
                              "pixels", param=param, code="video_too_large")
    if not stream.average_rate:
        raise BadRequestError(f"'{param}': the video's header gives no frame rate", param=param,
                              code="unsupported_video")
    if stream.frames > max_source_frames:
        raise BadRequestError(f"'{param}': the video has {stream.frames} frames, the limit is {max_source_frames}",
                              param=param, code="video_too_large")


def _count_packets(container: Any, stream: Any, max_source_frames: int, param: str) -> int:
    """The video's frame count from its packets (one per frame), then back to the start; a 400 past the limit."""
    av = require_av(param)
    count = 0
    try:
        for packet in container.demux(stream):
            count += packet.size > 0  # the demuxer's final packet is an empty flush marker
            if count > max_source_frames:
                raise BadRequestError(f"'{param}': the video has more than {max_source_frames} frames, the limit",
                                      param=param, code="video_too_large")
        container.seek(0)
    except (av.error.FFmpegError, ValueError) as exc:
        raise BadRequestError(f"'{param}': the video stream is corrupt ({_reason(exc)})", param=param) from None
    if count == 0:
        raise BadRequestError(f"'{param}': the video stream holds no frames", param=param)
    return count


def _decode(container: Any, stream: Any, indices: np.ndarray, param: str) -> np.ndarray:
    av = require_av(param)
    wanted, last = set(indices.tolist()), int(indices[-1])
    kept = []
    try:
        for i, frame in enumerate(container.decode(stream)):
            if i in wanted:
                kept.append(frame.to_ndarray(format="rgb24"))  # [H, W, 3] uint8
            if i >= last:
                break
    except (av.error.FFmpegError, ValueError) as exc:
        raise BadRequestError(f"'{param}': the video stream is corrupt ({_reason(exc)})", param=param) from None
    if len(kept) != len(indices):
        raise BadRequestError(f"'{param}': the video ended after {len(kept)} of the sampled frames; its header "
                              "promises more frames than it holds", param=param)
    if len({f.shape for f in kept}) != 1:
        raise BadRequestError(f"'{param}': the video's frame size changes mid-stream", param=param)
    return np.stack(kept)  # [n, H, W, 3] uint8
