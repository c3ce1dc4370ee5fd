"""A short video file from the chat page on a Qwen3-VL model (the tiny fixture checkpoint), in headless Chromium."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import trio

from kestrel_trio.model import Model, load_model

from browser_kit import Browser
from server_kit import fetch, running_server

pytest.importorskip("PIL.Image")
pytest.importorskip("av", reason="video files need PyAV (pip install 'kestrel-trio[video]')")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CLIP = FIXTURES / "qwen3_vl_video" / "clip.mp4"  # 10 frames, 80x56, lossless H.264
QUESTION = "What happens?"


@pytest.fixture(scope="module")
def vl_model() -> Model:
    return load_model(FIXTURES / "qwen3_vl")


async def test_an_attached_video_goes_to_a_video_model_as_a_video_url_part(browser: Browser, vl_model: Model,
                                                                           tmp_path: Path) -> None:
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(CLIP.read_bytes())
    url = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    with trio.fail_after(90):
        async with running_server(vl_model) as server:
            await browser.open_chat(server.port)
            accept = await browser.js("return document.getElementById('attach').accept")
            await browser.set_setting("#temperature", "0")
            await browser.set_setting("#max-tokens", "4")
            await browser.type_into("#attach", str(clip), clear=False)
            await browser.until("return document.querySelectorAll('#attachments video').length === 1")
            await browser.send(QUESTION)
            answer = await browser.answer_finished(1)
            shown = await browser.js("""const v = document.querySelector('article.user .images video');
                return v !== null && v.src.startsWith('data:video/mp4;base64,')""")
            direct = await fetch(server.port, "POST", "/v1/chat/completions", {
                "model": vl_model.name, "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                                          {"type": "text", "text": QUESTION}]}]},
                headers=(("content-type", "application/json"),))
    assert "video/mp4" in accept.split(",")
    assert answer["state"] == "done", answer
    assert shown
    # The server counted the video's tokens: exactly what the same file sent by hand costs.
    assert direct.status == 200, direct.body
    assert answer["prompt_tokens"] == direct.json()["usage"]["prompt_tokens"]
