"""Images of a chat request: limits, locating, reading and preprocessing, all before any engine work.

Theory of operation: the chat route calls :func:`prepare_images` with the
validated messages. A first pass on the event loop counts the images and
classifies each URL (remote URLs and malformed data URLs are refused at once,
nothing is decoded). A second pass, in a worker thread because it is CPU
work, decodes base64 or reads the allowed file, decodes the image and turns it
into patches (:func:`kestrel_trio.text.media.images.preprocess_image`). Every
refusal is a :class:`BadRequestError` whose ``param`` names the image part.
The chat template then sees each image part as ``{"type": "image"}``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import attrs
import trio

from kestrel_trio.errors import BadRequestError
from kestrel_trio.model import Model
from kestrel_trio.openai.request.image_urls import ImageRef, decode_data_url, image_parts, parse_image_url
from kestrel_trio.text.media.images import ProcessedImage, preprocess_image

__all__ = ["ImagePolicy", "prepare_images", "template_parts", "check_allowed_file", "media_bytes"]


def _absolute(folder: str | Path | None) -> Path | None:
    return None if folder is None else Path(os.path.abspath(folder))


@attrs.frozen
class ImagePolicy:
    """What image input a server accepts.

    Attributes:
        max_bytes: largest encoded image (bytes).
        max_pixels: largest decoded image, width * height (pixels), before any resize.
        max_images: images per request.
        allow_dir: ``file://`` URLs may name files under this folder (symlinks
            resolved); None refuses every ``file://`` URL.
    """

    max_bytes: int = attrs.field(default=10 * 2**20, validator=attrs.validators.ge(1))
    max_pixels: int = attrs.field(default=4096 * 4096, validator=attrs.validators.ge(1))
    max_images: int = attrs.field(default=4, validator=attrs.validators.ge(0))
    allow_dir: Path | None = attrs.field(default=None, converter=_absolute)


def template_parts(messages: list[dict]) -> list[dict]:
    """``messages`` with each ``image_url`` part replaced by ``{"type": "image"}`` and each ``video_url`` or
    ``video`` part by ``{"type": "video"}``, as Qwen-VL templates expect."""
    kinds = {"image_url": "image", "video_url": "video", "video": "video"}
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = [{"type": kinds[p["type"]]} if p["type"] in kinds else p for p in content]
    return messages


async def prepare_images(model: Model, messages: tuple[dict, ...], policy: ImagePolicy,
                         limiter: trio.CapacityLimiter) -> list[ProcessedImage]:
    """Check, read and preprocess every image of validated chat ``messages``, in prompt order.

    Args:
        model: the served model (its ``image_config`` shapes the patches).
        messages: validated messages (see :func:`kestrel_trio.openai.parse_chat_request`).
        policy: the server's image limits.
        limiter: bounds how many requests decode images at once (each decoded
            image can take tens of MB before it is resized).

    Raises:
        BadRequestError: images sent to a text-only model, too many images,
            a refused URL or file, bad base64, or an image that is corrupt,
            unsupported or over a limit; ``param`` names the image part.
    """
    found = image_parts(messages)
    if not found:
        return []
    model.require_vision(found[0][0])  # before any image is decoded
    if len(found) > policy.max_images:
        param = found[policy.max_images][0]
        raise BadRequestError(f"'{param}': at most {policy.max_images} images per request are accepted on this "
                              f"server, got {len(found)}", param=param, code="too_many_images")
    refs = [parse_image_url(url, param, max_bytes=policy.max_bytes) for param, url in found]
    for ref in refs:
        if ref.file_path is not None:
            _check_allowed(ref, policy)
    return await trio.to_thread.run_sync(_preprocess_all, model, refs, policy, limiter=limiter)


def _check_allowed(ref: ImageRef, policy: ImagePolicy) -> None:
    check_allowed_file(ref, policy.allow_dir)


def check_allowed_file(ref: ImageRef, allow_dir: Path | None, what: str = "image") -> None:
    """Refuse (400 naming the part) a ``file://`` reference outside ``allow_dir``, without touching the filesystem."""
    if allow_dir is None:
        raise BadRequestError(f"'{ref.param}': file:// {what} URLs are not allowed on this server "
                              "(it can be started with --allow-image-dir DIR)", param=ref.param,
                              code=f"{what}_url_not_allowed")
    path = Path(os.path.normpath(ref.file_path))
    if not (_under(path, allow_dir) or _under(path, allow_dir.resolve())):
        raise BadRequestError(f"'{ref.param}': the file is outside the folder allowed for {what}s",
                              param=ref.param, code=f"{what}_url_not_allowed")


def _open_beneath(folder: Path, path: Path) -> int:
    """A read-only descriptor of ``path`` (symlink-free, under ``folder``), opened one component at a time.

    Each component is opened relative to the one before with O_NOFOLLOW, so a
    directory or file swapped for a symlink after ``path`` was resolved fails
    (ELOOP / ENOTDIR) instead of leading out of the folder; O_NONBLOCK keeps a
    FIFO from blocking the thread (the caller then refuses it by fstat).
    """
    parts = path.relative_to(folder).parts
    if not parts:
        return os.open(folder, os.O_RDONLY)  # the folder itself, which fstat then refuses
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _preprocess_all(model: Model, refs: list[ImageRef], policy: ImagePolicy) -> list[ProcessedImage]:
    assert model.image_config is not None
    return [
        preprocess_image(_image_bytes(ref, policy), model.image_config, max_bytes=policy.max_bytes,
                         max_pixels=policy.max_pixels, param=ref.param)
        for ref in refs
    ]


def _image_bytes(ref: ImageRef, policy: ImagePolicy) -> bytes:
    return media_bytes(ref, policy.allow_dir, policy.max_bytes)


def media_bytes(ref: ImageRef, allow_dir: Path | None, max_bytes: int, what: str = "image") -> bytes:
    """The bytes of a ``data:`` reference, or of an allowed file (at most ``max_bytes + 1`` read).

    Raises:
        BadRequestError: bad base64, a missing, unreadable or irregular file, or one outside ``allow_dir``.
    """
    if ref.data_b64 is not None:
        return decode_data_url(ref)
    assert ref.file_path is not None and allow_dir is not None
    try:
        resolved = Path(ref.file_path).resolve(strict=True)
    except (OSError, RuntimeError):
        raise BadRequestError(f"'{ref.param}': no such {what} file", param=ref.param) from None
    if not _under(resolved, allow_dir.resolve()):  # a symlink pointing out of the folder
        raise BadRequestError(f"'{ref.param}': the file is outside the folder allowed for {what}s",
                              param=ref.param, code=f"{what}_url_not_allowed")
    try:
        fd = _open_beneath(allow_dir.resolve(), resolved)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise BadRequestError(f"'{ref.param}': not a regular file", param=ref.param)
            with open(fd, "rb", closefd=False) as file:
                return file.read(max_bytes + 1)  # one byte over is enough for the limit's error
        finally:
            os.close(fd)
    except OSError as exc:
        raise BadRequestError(f"'{ref.param}': cannot read the {what} file ({exc.strerror})", param=ref.param) from None
