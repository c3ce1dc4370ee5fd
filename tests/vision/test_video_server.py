"""Videos through the OpenAI API: the official client against a server on the Qwen3-VL GGUF pair.

The pair is served from a copy of the committed LM GGUF whose chat template renders video parts, as
Qwen3-VL's own template does (the committed one predates them). The expected answer is the pair's greedy
continuation computed here without the server, through the same decoding, preprocessing and prompt layout
(tests/vision/test_video_golden.py holds those to transformers). Clips are written here with PyAV.
"""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import numpy as np
import openai
import pytest
import trio

from kestrel_trio.app.media.videos import VideoPolicy
from kestrel_trio.errors import BadRequestError
from kestrel_trio.model import Model, load_model
from kestrel_trio.text.media.images import decode_image
from kestrel_trio.text.media.video_decode import decode_video
from kestrel_trio.text.media.videos import expand_video_placeholders, frame_timestamps, frames_to_video

from gguf_in.gguf_kit import rewrite_gguf
from server_kit import client_for, fetch, running_server
from test_vl_server import NEW_TOKENS, cut_text

av = pytest.importorskip("av", reason="video input needs PyAV (pip install 'kestrel-trio[video]')")
PIL_Image = pytest.importorskip("PIL.Image")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LM = FIXTURES / "qwen3_vl_gguf" / "lm-f16.gguf"
MMPROJ = FIXTURES / "qwen3_vl_gguf" / "mmproj-q8_0.gguf"
QUESTION = "What happens?"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Model:
    template = (FIXTURES / "qwen3_vl" / "chat_template.jinja").read_text()  # renders video parts
    assert "<|video_pad|>" in template
    copy = rewrite_gguf(LM, tmp_path_factory.mktemp("vl") / "lm-f16.gguf",
                        metadata={"tokenizer.chat_template": template})
    return load_model(copy, mmproj=MMPROJ)


def frames(count: int, width: int = 96, height: int = 64) -> np.ndarray:
    """uint8 [count, height, width, 3]: a gradient that moves from frame to frame."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([np.stack([(x * 3 + i * 20) % 256, (y * 4 + i * 7) % 256, (x + y + i * 30) % 256], axis=-1)
                     for i in range(count)]).astype(np.uint8)


def mp4(count: int, fps: int = 4) -> bytes:
    """An H.264 (yuv420p) MP4 of ``count`` frames at ``fps``."""
    out = io.BytesIO()
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        for frame in frames(count):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return out.getvalue()


def png(frame: np.ndarray) -> bytes:
    out = io.BytesIO()
    PIL_Image.fromarray(frame, "RGB").save(out, format="PNG")
    return out.getvalue()


def url(data: bytes, media: str) -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


def user(part: dict) -> list[dict]:
    return [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}]


def expected(model: Model, video_frames: np.ndarray, indices, fps: float) -> tuple[str, int]:
    """(greedy answer text, prompt tokens) of the video prompt, computed without the server."""
    config = model.video_config
    video = frames_to_video(video_frames, frame_timestamps(indices, fps, 2), config, param="p")
    template = model.apply_chat_template([{"role": "user", "content": [{"type": "video"},
                                                                      {"type": "text", "text": QUESTION}]}])
    ids = model.encode(expand_video_placeholders(template, [video]))
    vl = model.vision
    prompt = vl.prepare(np.asarray(ids), pixel_values_videos=video.pixel_values,
                        video_grid_thw=np.asarray([video.grid_thw]))
    cache = vl.new_cache()
    tokens = [int(np.argmax(vl.prefill(cache, prompt)))]
    while len(tokens) < NEW_TOKENS:
        tokens.append(int(np.argmax(vl.step(cache, np.array([tokens[-1]]), prompt.rope_delta))))
    return cut_text(model, tokens), len(ids)


def ask(server, msgs: list[dict]):
    with client_for(server) as client:
        response = client.chat.completions.create(model=server.state.model_id, messages=msgs, temperature=0,
                                                  max_tokens=NEW_TOKENS, extra_body={"ignore_eos": True})
    return response.choices[0].message.content, response.usage


async def test_an_mp4_video_url_and_a_frame_list_answer_on_the_gguf_pair(pair: Model) -> None:
    clip = mp4(8)
    config = pair.video_config
    decoded = decode_video(clip, fps=config.fps, min_frames=config.min_frames, max_frames=32, max_pixels=10**6,
                           max_source_frames=100, param="p")
    assert decoded.indices.tolist() == [0, 2, 5, 7]  # 2 s at 2 fps: 4 of the 8 frames, spread as linspace rounds
    from_file = expected(pair, decoded.frames, decoded.indices, decoded.fps)
    listed = frames(4)
    as_images = np.stack([np.asarray(decode_image(png(f), max_bytes=10**6, max_pixels=10**6)) for f in listed])
    from_frames = expected(pair, as_images, range(4), config.fps)  # a frame list is sampled at the server's fps
    with trio.fail_after(120):
        async with running_server(pair) as server:
            assert server.state.accepts_videos
            file_answer = await trio.to_thread.run_sync(
                lambda: ask(server, user({"type": "video_url", "video_url": {"url": url(clip, "video/mp4")}})))
            frames_answer = await trio.to_thread.run_sync(
                lambda: ask(server, user({"type": "video", "video": [url(png(f), "image/png") for f in listed]})))
            models = await fetch(server.port, "GET", "/v1/models")
    assert (file_answer[0], file_answer[1].prompt_tokens) == from_file
    assert (frames_answer[0], frames_answer[1].prompt_tokens) == from_frames
    assert models.json()["data"][0]["input_modalities"] == ["text", "image", "video"]


def refusal(server, part: dict) -> dict:
    """The 400's error object of a chat request with ``part``, through the official client."""
    with pytest.raises(openai.BadRequestError) as caught, client_for(server) as client:
        client.chat.completions.create(model=server.state.model_id, messages=user(part), max_tokens=1)
    assert caught.value.status_code == 400
    return caught.value.body


def video_url(data: bytes, media: str = "video/mp4") -> dict:
    return {"type": "video_url", "video_url": {"url": url(data, media)}}


PARAM = "messages[0].content[0].video_url"
REFUSALS = {
    "not_a_container": (video_url(b"RIFF0000AVI LIST"), PARAM, "not a supported video container"),
    "corrupt": (video_url(b"\x00\x00\x00\x18ftypisom" + bytes(200)), PARAM,
                "the video cannot be opened (Invalid data found when processing input)"),
    "image_media_type": (video_url(b"x", "image/png"), PARAM, "only video/* is accepted"),
    "remote": ({"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}}, PARAM,
               "remote video URLs are not fetched"),
    "file_not_allowed": ({"type": "video_url", "video_url": {"url": "file:///etc/passwd"}}, PARAM,
                         "file:// video URLs are not allowed"),
    "too_many_frames": ({"type": "video", "video": ["data:image/png;base64,AAAA"] * 5},
                        "messages[0].content[0].video", "at most 4 frames per video"),
    "frame_not_a_string": ({"type": "video", "video": [None]}, "messages[0].content[0].video[0]", "string"),
    "too_long": (None, PARAM, "the video has 10 frames, the limit is 8"),
    "too_large": (None, PARAM, "the limit is 512"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
async def test_bad_videos_and_limits_are_400s_naming_the_part(pair: Model, case: str) -> None:
    part, param, message = REFUSALS[case]
    policy = VideoPolicy(max_frames=4, max_source_frames=8 if case == "too_long" else 3600,
                         max_bytes=512 if case == "too_large" else 2**20)
    part = part or video_url(mp4(10))
    with trio.fail_after(60):
        async with running_server(pair, video_policy=policy) as server:
            error = await trio.to_thread.run_sync(refusal, server, part)
    assert error["param"] == param, error
    assert message in error["message"], error


async def test_without_pyav_a_video_file_is_a_400_and_not_listed(pair: Model, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # import av now raises ImportError
    with trio.fail_after(60):
        async with running_server(pair) as server:
            assert not server.state.accepts_videos
            error = await trio.to_thread.run_sync(refusal, server, video_url(b"\x00\x00\x00\x18ftypisom"))
            models = await fetch(server.port, "GET", "/v1/models")
    assert error["param"] == PARAM and "needs PyAV" in error["message"] and "kestrel-trio[video]" in error["message"]
    assert models.json()["data"][0]["input_modalities"] == ["text", "image"]


async def test_a_video_to_a_text_only_model_is_a_400() -> None:
    with trio.fail_after(60):
        async with running_server(load_model(FIXTURES / "qwen3_bf16_tied")) as server:
            error = await trio.to_thread.run_sync(refusal, server, video_url(b"x"))
    assert error["param"] == PARAM and "does not accept videos" in error["message"]


async def test_a_second_video_and_frames_of_two_sizes_are_400s_naming_the_part(pair: Model) -> None:
    clip = video_url(mp4(8))
    small, large = url(png(frames(1)[0]), "image/png"), url(png(frames(1, 64, 32)[0]), "image/png")
    with trio.fail_after(60):
        async with running_server(pair) as server:
            def send(parts: list[dict]) -> dict:
                with pytest.raises(openai.BadRequestError) as caught, client_for(server) as client:
                    client.chat.completions.create(model=server.state.model_id, max_tokens=1,
                                                   messages=[{"role": "user", "content": parts}])
                return caught.value.body

            two = await trio.to_thread.run_sync(send, [clip, clip])
            mixed = await trio.to_thread.run_sync(send, [{"type": "video", "video": [small, large]}])
    assert two["param"] == "messages[0].content[1].video_url" and "at most 1 videos" in two["message"]
    assert mixed["param"] == "messages[0].content[0].video[1]" and "share one size" in mixed["message"]


def test_a_webm_without_a_frame_count_has_its_packets_counted() -> None:
    """Browsers' WebM files carry no frame count; the frames are counted from the packets, then sampled."""
    codec = next((c for c in ("libvpx-vp9", "libvpx") if c in av.codecs_available), None)
    if codec is None:
        pytest.skip("this PyAV build has no VP9 or VP8 encoder to write a WebM with")
    out = io.BytesIO()
    with av.open(out, "w", format="webm") as container:
        stream = container.add_stream(codec, rate=10)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        for frame in frames(12):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    data = out.getvalue()
    with av.open(io.BytesIO(data), format="matroska") as container:
        assert container.streams.video[0].frames == 0  # the header has none
    decoded = decode_video(data, fps=2, min_frames=4, max_frames=32, max_pixels=10**6, max_source_frames=100,
                           param="p")
    assert decoded.indices.tolist() == [0, 4, 7, 11] and decoded.fps == 10  # 1.2 s at 2 fps: 2, raised to 4
    assert decoded.frames.shape == (4, 64, 96, 3)
    with pytest.raises(BadRequestError, match="more than 8 frames, the limit") as caught:
        decode_video(data, fps=2, min_frames=4, max_frames=32, max_pixels=10**6, max_source_frames=8, param="p")
    assert caught.value.param == "p"


async def test_a_file_url_under_the_allowed_folder_reads_the_same_video(pair: Model, tmp_path: Path) -> None:
    clip = mp4(8)
    (tmp_path / "clip.mp4").write_bytes(clip)
    with trio.fail_after(120):
        async with running_server(pair, allow_image_dir=tmp_path) as server:
            inline = await trio.to_thread.run_sync(
                lambda: ask(server, user({"type": "video_url", "video_url": {"url": url(clip, "video/mp4")}})))
            from_file = await trio.to_thread.run_sync(
                lambda: ask(server, user({"type": "video_url",
                                          "video_url": {"url": (tmp_path / "clip.mp4").as_uri()}})))
            outside = await trio.to_thread.run_sync(
                refusal, server, {"type": "video_url", "video_url": {"url": "file:///etc/hostname"}})
    assert from_file[0] == inline[0] and from_file[1].prompt_tokens == inline[1].prompt_tokens
    assert outside["param"] == PARAM and "outside the folder allowed for videos" in outside["message"]
