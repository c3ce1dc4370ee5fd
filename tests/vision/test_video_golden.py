"""A short MP4 clip through kestrel's video path against transformers' own processor and model.

tests/fixtures/make_vl_video_fixtures.py wrote the clip (lossless H.264 RGB, so every FFmpeg decodes the same
pixels) and ran transformers' PyAV reader, Qwen3VLVideoProcessor (sampling at 2 and 4 fps, resize, temporal
patches) and Qwen3VLProcessor (the ``<t seconds>`` text), then the model on the folder's weights and on the
GGUF pair's. Here the same bytes go through kestrel's decoding, preprocessing and prompt layout, then the
folder model and the GGUF pair: pixel values bit for bit, token ids exactly, logits within 1e-4 of their
largest magnitude, and the greedy continuation token for token.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kestrel_trio.model import Model, load_model
from kestrel_trio.text.media.video_decode import decode_video
from kestrel_trio.text.media.videos import expand_video_placeholders, frame_timestamps, frames_to_video

pytest.importorskip("av", reason="video decoding needs PyAV (pip install 'kestrel-trio[video]')")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CLIP = FIXTURES / "qwen3_vl_video" / "clip.mp4"
LM = FIXTURES / "qwen3_vl_gguf" / "lm-f16.gguf"
MMPROJ = FIXTURES / "qwen3_vl_gguf" / "mmproj-q8_0.gguf"
RTOL = 1e-4
MESSAGES = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]


@pytest.fixture(scope="module")
def golden():
    return np.load(FIXTURES / "qwen3_vl_video" / "video_golden.npz")


@pytest.fixture(scope="module")
def folder_model() -> Model:
    return load_model(FIXTURES / "qwen3_vl")


def processed(model: Model, fps: float):
    """(video, prompt ids) of the clip sampled at ``fps``, as the chat route lays it out."""
    config = model.video_config
    decoded = decode_video(CLIP.read_bytes(), fps=fps, min_frames=config.min_frames, max_frames=config.max_frames,
                           max_pixels=10**6, max_source_frames=100, param="p")
    stamps = frame_timestamps(decoded.indices, decoded.fps, config.pixels.temporal_patch_size)
    video = frames_to_video(decoded.frames, stamps, config, param="p")
    prompt = expand_video_placeholders(model.apply_chat_template(MESSAGES, add_generation_prompt=True), [video])
    return decoded, video, model.encode(prompt)


@pytest.mark.parametrize("fps", [2, 4])
def test_decoding_sampling_patches_and_prompt_equal_transformers(folder_model: Model, golden, fps: int) -> None:
    decoded, video, ids = processed(folder_model, fps)
    assert decoded.indices.tolist() == golden[f"fps{fps}_frames_indices"].tolist()
    assert list(video.grid_thw) == golden[f"fps{fps}_video_grid_thw"][0].tolist()
    np.testing.assert_array_equal(video.pixel_values, golden[f"fps{fps}_pixel_values_videos"])
    assert ids == golden[f"fps{fps}_input_ids"].tolist()


def greedy_and_logits(model: Model, ids: list[int], video, n: int) -> tuple[np.ndarray, list[int]]:
    vl = model.vision
    prompt = vl.prepare(np.asarray(ids), pixel_values_videos=video.pixel_values,
                        video_grid_thw=np.asarray([video.grid_thw]))
    cache = vl.new_cache()
    logits = vl.prefill(cache, prompt, all_logits=True)  # [T, vocab]
    tokens = [int(np.argmax(logits[-1]))]
    while len(tokens) < n:
        tokens.append(int(np.argmax(vl.step(cache, np.array([tokens[-1]]), prompt.rope_delta))))
    return logits, tokens


def test_the_folder_model_on_the_clip_reproduces_transformers(folder_model: Model, golden) -> None:
    want, greedy = golden["folder_logits"], golden["folder_greedy_ids"]
    _, video, ids = processed(folder_model, 2)
    logits, tokens = greedy_and_logits(folder_model, ids, video, len(greedy))
    np.testing.assert_allclose(logits, want, rtol=0, atol=RTOL * float(np.abs(want).max()))
    assert tokens == greedy.tolist()


def test_the_gguf_pair_on_the_clip_reproduces_transformers(folder_model: Model, golden) -> None:
    """The model half: the folder's pixels and prompt (as the goldens fed transformers) on the pair's weights.

    The pair's own pixel bounds are Qwen3-VL's published ones (an mmproj file holds none, see
    mmproj_image_fields), not the tiny folder's, and its committed template predates video parts
    (test_video_server.py serves a copy that renders them).
    """
    pair = load_model(LM, mmproj=MMPROJ)
    _, video, ids = processed(folder_model, 2)
    want, greedy = golden["gguf_logits"], golden["gguf_greedy_ids"]
    logits, tokens = greedy_and_logits(pair, ids, video, len(greedy))
    np.testing.assert_allclose(logits, want, rtol=0, atol=RTOL * float(np.abs(want).max()))
    assert tokens == greedy.tolist()
