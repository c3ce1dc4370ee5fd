"""Where an ``image_url`` content part points: inline data or a local file, never the network.

Sans-IO: this module only reads the URL string. A ``data:`` URL's payload is
kept base64-encoded here (decoding is CPU work the caller may move off the
event loop, see :func:`decode_data_url`); a ``file://`` URL becomes a path the
caller must check against its allowed folder before reading anything.
"""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse

import attrs

from kestrel_trio.errors import BadRequestError

__all__ = ["ImageRef", "parse_image_url", "decode_data_url", "image_parts", "video_parts"]

# data:[<media type>][;param=value]*;base64,<payload>
_DATA_URL = re.compile(r"data:(?P<media>[^;,]*)(?P<params>(?:;[^;,]*)*),(?P<payload>.*)", re.DOTALL | re.IGNORECASE)
_WHITESPACE = str.maketrans("", "", " \t\r\n")
_EXAMPLE = {"image": "image/png", "video": "video/mp4"}


@attrs.frozen
class ImageRef:
    """One image of a request, located but not yet read or decoded.

    Attributes:
        param: the request field, e.g. ``messages[0].content[1].image_url``.
        data_b64: the base64 payload of a ``data:`` URL (whitespace removed), or None.
        file_path: the path of a ``file://`` URL, or None.
    """

    param: str
    data_b64: str | None = None
    file_path: str | None = None


def parse_image_url(url: str, param: str, *, max_bytes: int, media: str = "image") -> ImageRef:
    """Classify an image (or video) URL; refuse what the server will not read.

    Args:
        url: the ``image_url.url`` (``video_url.url``) string.
        param: the request field named in errors.
        max_bytes: largest accepted file (bytes); a ``data:`` payload too long
            to fit is refused without decoding it.
        media: ``"image"`` or ``"video"``: the accepted ``data:`` media types are ``{media}/*``.

    Raises:
        BadRequestError: a remote (http/https) or other unsupported URL, a
            malformed ``data:`` URL, another media type, or too many bytes.
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        raise BadRequestError(
            f"'{param}': remote {media} URLs are not fetched by this server; send the {media} inline as "
            f"'data:{_EXAMPLE[media]};base64,...'", param=param, code=f"{media}_url_not_allowed")
    if scheme == "file":
        return ImageRef(param=param, file_path=_file_path(url, param))
    if scheme != "data":
        raise BadRequestError(f"'{param}' must be a 'data:{media}/...;base64,...' URL", param=param)
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise BadRequestError(f"'{param}' is a malformed data URL (no ',' before the payload)", param=param)
    declared = match["media"].strip().lower()
    if declared and not declared.startswith(f"{media}/"):
        raise BadRequestError(f"'{param}' has media type {declared!r}; only {media}/* is accepted", param=param)
    if "base64" not in (p.strip().lower() for p in match["params"].split(";")):
        raise BadRequestError(f"'{param}' must be a base64 data URL ('data:{_EXAMPLE[media]};base64,...')", param=param)
    payload = match["payload"].translate(_WHITESPACE)
    if len(payload) // 4 * 3 > max_bytes + 2:  # base64 holds 3 bytes per 4 characters; +2 covers padding
        raise BadRequestError(f"'{param}': the {media} is about {len(payload) // 4 * 3} bytes, the limit is "
                              f"{max_bytes}", param=param, code=f"{media}_too_large")
    return ImageRef(param=param, data_b64=payload)


def _file_path(url: str, param: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise BadRequestError(f"'{param}' must be a local 'file:///absolute/path' URL", param=param)
    path = urllib.parse.unquote(parts.path)
    if not path.startswith("/") or "\x00" in path:
        raise BadRequestError(f"'{param}' must be a local 'file:///absolute/path' URL", param=param)
    return path


def decode_data_url(ref: ImageRef) -> bytes:
    """The image bytes of a ``data:`` reference.

    Raises:
        BadRequestError: the payload is not valid base64.
    """
    assert ref.data_b64 is not None
    try:
        return base64.b64decode(ref.data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequestError(f"'{ref.param}': the data URL's payload is not valid base64", param=ref.param) from None


def image_parts(messages: tuple[dict, ...]) -> list[tuple[str, str]]:
    """``(param, url)`` of every image part of validated messages, in prompt order."""
    found = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if part["type"] == "image_url":
                found.append((f"messages[{i}].content[{j}].image_url", part["image_url"]["url"]))
    return found


def video_parts(messages: tuple[dict, ...]) -> list[tuple[str, str | list[str]]]:
    """``(param, url or frame URLs)`` of every video part of validated messages, in prompt order.

    A ``video_url`` part gives its URL (``param`` ends ``.video_url``); a ``video`` part its list of
    frame image URLs (``param`` ends ``.video``).
    """
    found: list[tuple[str, str | list[str]]] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if part["type"] == "video_url":
                found.append((f"messages[{i}].content[{j}].video_url", part["video_url"]["url"]))
            elif part["type"] == "video":
                found.append((f"messages[{i}].content[{j}].video", list(part["video"])))
    return found
