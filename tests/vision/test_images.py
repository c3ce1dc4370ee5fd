"""Image preprocessing against transformers' Qwen2-VL image processor goldens."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

from kestrel_trio import BadRequestError, KestrelError, ModelLoadError
from kestrel_trio.text import ChatTemplate, Tokenizer
from kestrel_trio.text.media.images import (
    ImageProcessorConfig,
    decode_image,
    expand_image_pads,
    preprocess_image,
    smart_resize,
)

PIL_Image = pytest.importorskip("PIL.Image")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_vl"
NAMES = ["up", "down", "exact", "tall", "gray"]
IMAGE_PAD = 511
LIMITS = {"max_bytes": 1 << 20, "max_pixels": 1 << 20}


@pytest.fixture(scope="module")
def golden():
    return np.load(FIXTURE / "vl_golden.npz")


@pytest.fixture(scope="module")
def config():
    return ImageProcessorConfig.read(FIXTURE)


def _encode(array: np.ndarray, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    PIL_Image.fromarray(array).save(out, format=fmt)
    return out.getvalue()


@pytest.mark.parametrize("name", NAMES)
def test_pixel_values_equal_the_processor(golden, config, name):
    image = preprocess_image(golden[f"image_bytes_{name}"].tobytes(), config, **LIMITS)
    assert list(image.grid_thw) == golden[f"image_grid_thw_{name}"][0].tolist()
    assert image.pixel_values.dtype == np.float32
    assert np.array_equal(image.pixel_values, golden[f"pixel_values_{name}"])


@pytest.mark.parametrize("name", NAMES)
def test_pad_expansion_equals_the_processor(golden, config, name):
    image = preprocess_image(golden[f"image_bytes_{name}"].tobytes(), config, **LIMITS)
    t, h, w = image.grid_thw
    assert image.num_tokens == t * h * w // 4
    expanded = expand_image_pads(golden["collapsed_input_ids"].tolist(), IMAGE_PAD, [image.num_tokens])
    assert expanded == golden[f"input_ids_{name}"].tolist()
    assert expanded.count(IMAGE_PAD) == image.num_tokens


def test_the_chat_template_renders_image_parts_as_the_fixture_prompt(golden):
    tokenizer = Tokenizer.from_folder(FIXTURE)
    template = ChatTemplate(tokenizer.chat_template, special_tokens=tokenizer.special_tokens_map)
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [
            {"type": "text", "text": "Look: "},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
            {"type": "text", "text": "What is the weather today?"},
        ]},
    ]
    prompt = template.render(messages, add_generation_prompt=True)
    assert "<|vision_start|><|image_pad|><|vision_end|>" in prompt
    assert tokenizer.encode(prompt) == golden["collapsed_input_ids"].tolist()


@pytest.mark.parametrize("size, expected", [
    ((40, 48), (64, 96)),  # too small: scaled up
    ((200, 300), (96, 128)),  # too large: scaled down
    ((64, 96), (64, 96)),  # already on the grid
    ((130, 40), (128, 32)),  # rounded to the grid
])
def test_smart_resize(size, expected):
    assert smart_resize(*size, factor=32, min_pixels=64 * 64, max_pixels=128 * 128) == expected


def test_smart_resize_rejects_extreme_strips():
    with pytest.raises(BadRequestError, match="aspect ratio"):
        smart_resize(10, 2010, factor=32, min_pixels=1024, max_pixels=1 << 20)


def test_alpha_is_composited_on_white():
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)  # fully transparent black
    image = decode_image(_encode(rgba), **LIMITS)
    assert image.mode == "RGB" and np.asarray(image).min() == 255


@pytest.mark.parametrize("data, match", [
    (b"definitely not an image", "not a supported image"),
    (b"", "empty"),
])
def test_garbage_is_a_bad_request(config, data, match):
    with pytest.raises(BadRequestError, match=match):
        preprocess_image(data, config, **LIMITS)


def test_truncated_png_is_a_bad_request(config):
    data = _encode(np.full((64, 64, 3), 7, np.uint8))[:-30]
    with pytest.raises(BadRequestError, match="corrupt") as info:
        preprocess_image(data, config, **LIMITS)
    assert info.value.param == "messages"


def test_unsupported_format_is_a_bad_request(config):
    with pytest.raises(BadRequestError, match="PNG, JPEG, WEBP"):
        preprocess_image(_encode(np.zeros((8, 8, 3), np.uint8), "GIF"), config, **LIMITS)


def test_too_many_bytes_is_a_bad_request(golden, config):
    data = golden["image_bytes_up"].tobytes()
    with pytest.raises(BadRequestError, match=f"{len(data)} bytes"):
        preprocess_image(data, config, max_bytes=len(data) - 1, max_pixels=1 << 20)
    preprocess_image(data, config, max_bytes=len(data), max_pixels=1 << 20)


def test_too_many_pixels_is_a_bad_request(golden, config):
    data = golden["image_bytes_down"].tobytes()  # 300 x 200
    with pytest.raises(BadRequestError, match="300x200 pixels"):
        preprocess_image(data, config, max_bytes=1 << 20, max_pixels=300 * 200 - 1)


def test_pad_count_must_match_the_images():
    with pytest.raises(BadRequestError, match="2 image placeholders but 1 images"):
        expand_image_pads([1, IMAGE_PAD, 2, IMAGE_PAD], IMAGE_PAD, [4])


def test_two_images_expand_in_order():
    assert expand_image_pads([1, IMAGE_PAD, 2, IMAGE_PAD], IMAGE_PAD, [2, 3]) == [1] + [IMAGE_PAD] * 2 + [2] + [IMAGE_PAD] * 3


def test_missing_pillow_is_a_clear_error(monkeypatch, golden, config):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(KestrelError, match="pip install 'kestrel-trio\\[vision\\]'"):
        preprocess_image(golden["image_bytes_up"].tobytes(), config, **LIMITS)


def test_legacy_min_max_pixels_are_read():
    config = ImageProcessorConfig.from_dict({"min_pixels": 100, "max_pixels": 200, "patch_size": 16})
    assert (config.min_pixels, config.max_pixels, config.factor) == (100, 200, 32)


def test_bad_preprocessor_field_is_named():
    with pytest.raises(ModelLoadError, match="'image_std'"):
        ImageProcessorConfig.from_dict({"image_std": [0.5, 0.5]})
