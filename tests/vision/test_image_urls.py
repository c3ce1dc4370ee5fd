"""Image URL classification (sans-IO) and the chat template's view of image parts."""

from __future__ import annotations

import base64
import os
import json
from pathlib import Path

import pytest

from kestrel_trio import BadRequestError
from kestrel_trio.openai import parse_chat_request
from kestrel_trio.openai.request.image_urls import ImageRef, decode_data_url, image_parts, parse_image_url
from kestrel_trio.app.media import images as routes_images
from kestrel_trio.app.media.images import ImagePolicy, template_parts
from kestrel_trio.text import ChatTemplate

PARAM = "messages[0].content[1].image_url"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_vl"


def _refused(url: str, *fragments: str, max_bytes: int = 1000) -> BadRequestError:
    with pytest.raises(BadRequestError) as caught:
        parse_image_url(url, PARAM, max_bytes=max_bytes)
    assert caught.value.param == PARAM and caught.value.status == 400
    for fragment in fragments:
        assert fragment in caught.value.message
    return caught.value


def test_data_urls_keep_their_payload_undecoded_until_asked():
    payload = base64.b64encode(b"\x89PNG fake").decode()
    ref = parse_image_url(f"data:image/png;base64,{payload[:4]}\n{payload[4:]}", PARAM, max_bytes=1000)
    assert ref == ImageRef(param=PARAM, data_b64=payload)
    assert decode_data_url(ref) == b"\x89PNG fake"
    # The media type may be absent or carry parameters; the scheme and base64 flag are case-insensitive.
    assert parse_image_url(f"DATA:;charset=x;BASE64,{payload}", PARAM, max_bytes=1000).data_b64 == payload


@pytest.mark.parametrize("url, fragment", [
    ("http://example.com/a.png", "not fetched"),
    ("HTTPS://example.com/a.png", "not fetched"),
    ("ftp://example.com/a.png", "data:image"),
    ("a.png", "data:image"),
    ("data:image/png;base64", "malformed"),
    ("data:image/png,abc", "base64"),
    ("data:text/html;base64,PGI+", "image/"),
    ("file://example.com/etc/passwd", "local"),
    ("file:relative.png", "local"),
])
def test_refused_urls_name_the_part(url, fragment):
    _refused(url, fragment)


def test_an_oversize_payload_is_refused_before_decoding():
    payload = "A" * 4 * 300  # 900 bytes once decoded
    assert parse_image_url(f"data:image/png;base64,{payload}", PARAM, max_bytes=900).data_b64 == payload
    # Up to 2 bytes of slack: padding ('=') shortens the decoded size, which is checked exactly later.
    assert parse_image_url(f"data:image/png;base64,{payload}", PARAM, max_bytes=898).data_b64 == payload
    _refused(f"data:image/png;base64,{payload}", "about 900 bytes", "limit is 897", max_bytes=897)
    _refused(f"data:image/png;base64,{'A' * 4 * 10**5}", "limit", max_bytes=1000)


def test_bad_base64_is_refused_on_decoding():
    with pytest.raises(BadRequestError) as caught:
        decode_data_url(ImageRef(param=PARAM, data_b64="iVBOR*w0KGgo="))
    assert caught.value.param == PARAM and "base64" in caught.value.message


def test_file_urls_become_paths_for_the_caller_to_check():
    assert parse_image_url("file:///srv/images/a%20b.png", PARAM, max_bytes=1).file_path == "/srv/images/a b.png"
    assert parse_image_url("file://localhost/x.png", PARAM, max_bytes=1).file_path == "/x.png"


def test_image_parts_are_found_in_prompt_order_and_shown_to_the_template_as_images():
    url = "data:image/png;base64,AAAA"
    body = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url + "1", "detail": "high"}},
                                     {"type": "text", "text": "and"},
                                     {"type": "image_url", "image_url": {"url": url + "2"}}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "then"},
                                     {"type": "image_url", "image_url": {"url": url}}]},
    ]}
    chat = parse_chat_request(json.dumps(body).encode(), allow_images=True)
    assert image_parts(chat.messages) == [
        ("messages[1].content[0].image_url", url + "1"),
        ("messages[1].content[2].image_url", url + "2"),
        ("messages[3].content[1].image_url", url),
    ]
    shown = template_parts(chat.template_messages())
    assert shown[1]["content"] == [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]
    assert chat.messages[1]["content"][0]["type"] == "image_url"  # the validated request is left alone
    template = ChatTemplate((FIXTURE / "chat_template.jinja").read_text())
    prompt = template.render(shown, add_generation_prompt=True)
    assert prompt.count("<|vision_start|><|image_pad|><|vision_end|>") == 3
    assert "<|vision_end|>and<|vision_start|>" in prompt


def _allowed_tree(tmp_path):
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    (allowed / "sub" / "img.png").write_bytes(b"inside")
    (outside / "img.png").write_bytes(b"secret")
    return allowed, outside


def test_a_folder_swapped_for_a_symlink_after_the_check_is_not_followed(tmp_path):
    allowed, outside = _allowed_tree(tmp_path)
    policy = ImagePolicy(allow_dir=allowed)
    ref = ImageRef(PARAM, file_path=str(allowed / "sub" / "img.png"))
    assert routes_images._image_bytes(ref, policy) == b"inside"
    resolved = (allowed / "sub" / "img.png").resolve()
    (allowed / "sub" / "img.png").unlink()
    (allowed / "sub").rmdir()
    (allowed / "sub").symlink_to(outside)  # the swap, after the path was resolved
    with pytest.raises(OSError):
        routes_images._open_beneath(allowed.resolve(), resolved)


def test_a_file_swapped_for_a_symlink_after_the_check_is_not_followed(tmp_path):
    allowed, outside = _allowed_tree(tmp_path)
    resolved = (allowed / "sub" / "img.png").resolve()
    (allowed / "sub" / "img.png").unlink()
    (allowed / "sub" / "img.png").symlink_to(outside / "img.png")
    with pytest.raises(OSError):
        routes_images._open_beneath(allowed.resolve(), resolved)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_an_image_path_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    allowed, _ = _allowed_tree(tmp_path)
    target = allowed / "sub" / "pipe"
    if kind == "fifo":
        os.mkfifo(target)  # no writer: a blocking open would hang here
    else:
        target = allowed / "sub"
    with pytest.raises(BadRequestError, match="not a regular file"):
        routes_images._image_bytes(ImageRef(PARAM, file_path=str(target)), ImagePolicy(allow_dir=allowed))
