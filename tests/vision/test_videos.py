"""Video preprocessing arithmetic on its own: frame sampling, frame sizes, temporal patches, timestamps, prompt text.

The expected values follow transformers' Qwen3VLVideoProcessor and Qwen3VLProcessor (5.25), worked out by hand
here; tests/vision/test_video_golden.py holds the whole path to their actual output.
"""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio.errors import BadRequestError
from kestrel_trio.text.media.frame_resize import resize_bicubic_uint8
from kestrel_trio.text.media.images import ImageProcessorConfig
from kestrel_trio.text.media.videos import (
    ProcessedVideo, VideoProcessorConfig, expand_video_placeholders, frame_timestamps, frames_to_video,
    sample_indices, video_placeholder, video_smart_resize,
)

PAD, START, END = "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"


@pytest.mark.parametrize("total, video_fps, fps, want", [
    (100, 25.0, 2.0, [0, 14, 28, 42, 57, 71, 85, 99]),  # 4 s at 2 fps: 8 frames, linspace rounded
    (10, 5.0, 2.0, [0, 3, 6, 9]),  # 2 s at 2 fps: 4 frames
    (6, 30.0, 2.0, [0, 2, 3, 5]),  # 0.2 s: 0 frames wanted, raised to min_frames 4
    (3, 30.0, 2.0, [0, 1, 2]),  # fewer frames than min_frames: all of them
    (3000, 30.0, 2.0, list(np.linspace(0, 2999, 16).round().astype(int))),  # 200 wanted, capped at max_frames
])
def test_frames_are_sampled_as_sample_frames_does(total, video_fps, fps, want) -> None:
    assert sample_indices(total, video_fps, fps, min_frames=4, max_frames=16).tolist() == want


def test_timestamps_average_each_temporal_patch_and_pad_an_odd_count() -> None:
    assert frame_timestamps([0, 3, 6, 9], 5.0, 2) == pytest.approx((0.3, 1.5))
    assert frame_timestamps([0, 10, 20], 10.0, 2) == pytest.approx((0.5, 2.0))  # frame 20 repeated: (2 + 2) / 2
    assert frame_timestamps(range(4), 2.0, 2) == pytest.approx((0.25, 1.25))  # a frame list at the server's fps


@pytest.mark.parametrize("frames, height, width, want", [
    (4, 360, 640, (352, 640)),  # within the bounds: sides rounded to multiples of 32
    # round(22.5) = 22 (half to even); 64 x 704 x 1280 is over 16,777,216: beta = sqrt(64*720*1280 / max) = 1.875,
    # sides floor(720 / 1.875 / 32) * 32 and floor(1280 / 1.875 / 32) * 32
    (64, 720, 1280, (384, 672)),
    (2, 20, 40, (128, 256)),  # a side under 32 is scaled up first (to 32 x 64); 2 x 32 x 64 < min: beta = 4
])
def test_frame_sizes_follow_the_video_smart_resize(frames, height, width, want) -> None:
    got = video_smart_resize(frames, height, width, temporal_factor=2, factor=32, min_pixels=65536,
                             max_pixels=16777216, param="p")
    assert got == want


def test_one_frame_and_a_thin_strip_are_refused_naming_the_part() -> None:
    with pytest.raises(BadRequestError, match="needs at least 2 frames, got 1") as caught:
        video_smart_resize(1, 64, 64, temporal_factor=2, factor=32, min_pixels=1, max_pixels=10**9, param="v")
    assert caught.value.param == "v"
    with pytest.raises(BadRequestError, match="aspect ratio"):
        video_smart_resize(2, 32, 32 * 201, temporal_factor=2, factor=32, min_pixels=1, max_pixels=10**9, param="v")


def test_patches_hold_two_frames_each_in_merge_block_order() -> None:
    pixels = ImageProcessorConfig(patch_size=2, merge_size=2, temporal_patch_size=2, do_resize=False,
                                  do_rescale=False, do_normalize=False)
    config = VideoProcessorConfig(pixels=pixels)
    frames = np.arange(3 * 4 * 8 * 3, dtype=np.uint8).reshape(3, 4, 8, 3)  # [n, H, W, C], distinct values
    video = frames_to_video(frames, (0.0, 1.0), config, param="p")
    assert video.grid_thw == (2, 2, 4) and video.pixel_values.shape == (16, 3 * 2 * 2 * 2)
    padded = np.concatenate([frames, frames[-1:]])  # [4, H, W, C]: the odd third frame repeated
    # Row 5 = temporal patch 0, merge block (0, 1) (rows 4..7), its patch (0, 1): pixel rows 0-1, columns 6-7.
    want = padded[0:2, 0:2, 6:8, :].transpose(3, 0, 1, 2).reshape(-1)  # [C, T, P, P]
    np.testing.assert_array_equal(video.pixel_values[5], want.astype(np.float32))
    # Row 9 = temporal patch 1 (frames 2 and 2 again), merge block (0, 0), patch (0, 1).
    want = padded[2:4, 0:2, 2:4, :].transpose(3, 0, 1, 2).reshape(-1)
    np.testing.assert_array_equal(video.pixel_values[9], want.astype(np.float32))


def test_normalisation_is_transformers_fused_float32_form() -> None:
    config = VideoProcessorConfig.from_dict({"size": {"shortest_edge": 1, "longest_edge": 10**9}, "patch_size": 2,
                                             "merge_size": 1, "do_resize": False}, source="t")
    frames = np.full((2, 2, 2, 3), 200, dtype=np.uint8)
    value = frames_to_video(frames, (0.0,), config, param="p").pixel_values[0, 0]
    mean, std = np.float32(0.5) * np.float32(255.0), np.float32(0.5) * np.float32(255.0)  # the class's defaults
    assert value == (np.float32(200) - mean) / std


def test_resizing_to_the_same_size_changes_nothing() -> None:
    frames = np.random.default_rng(0).integers(0, 256, size=(2, 9, 7, 3), dtype=np.uint8)
    np.testing.assert_array_equal(resize_bicubic_uint8(frames, 9, 7), frames)


def _video(t: int, timestamps: tuple[float, ...]) -> ProcessedVideo:
    return ProcessedVideo(pixel_values=np.zeros((t * 8, 4), np.float32), grid_thw=(t, 2, 4), merge_size=2,
                          timestamps=timestamps)


def test_the_prompt_text_is_qwen3vl_processors() -> None:
    video = _video(2, (0.3, 1.5))
    frame = f"{START}{PAD * 2}{END}"
    assert video_placeholder(video) == f"<0.3 seconds>{frame}<1.5 seconds>{frame}"
    wrapped = f"user\n{START}{PAD}{END}Hi"
    assert expand_video_placeholders(wrapped, [video]) == f"user\n<0.3 seconds>{frame}<1.5 seconds>{frame}Hi"
    assert expand_video_placeholders(f"{PAD}x{PAD}", [_video(1, (0.25,)), _video(1, (2.0,))]) == (
        f"<0.2 seconds>{frame}x<2.0 seconds>{frame}")  # bare pads too; one decimal, as f"{t:.1f}" rounds
    with pytest.raises(BadRequestError, match="the prompt has 0 video placeholders but 1 videos were given"):
        expand_video_placeholders("a template that renders no video", [video])


def test_a_config_file_overrides_the_class_defaults_and_bad_fields_name_the_file() -> None:
    config = VideoProcessorConfig.from_dict({"fps": 1, "max_frames": 64}, source="f.json")
    assert (config.fps, config.min_frames, config.max_frames) == (1.0, 4, 64)
    assert (config.pixels.patch_size, config.pixels.min_pixels, config.pixels.max_pixels) == (16, 131072, 786432)
    from kestrel_trio.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="f.json: field 'fps' must be a positive number"):
        VideoProcessorConfig.from_dict({"fps": 0}, source="f.json")
