"""Images from the chat page on a Qwen3-VL model (the tiny fixture checkpoint), in headless Chromium."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import trio

from kestrel_trio.model import Model, load_model

from browser_kit import Browser
from server_kit import fetch, running_server

PIL_Image = pytest.importorskip("PIL.Image")

VL_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_vl"
QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def vl_model() -> Model:
    return load_model(VL_FIXTURE)


def _picture(path: Path) -> Path:
    image = PIL_Image.new("RGB", (64, 48), (30, 90, 160))
    for x in range(64):
        image.putpixel((x, x % 48), (240, 170, 60))
    image.save(path, format="PNG")
    return path


async def test_an_attached_image_goes_to_a_vision_model_as_an_image_url_part(browser: Browser, vl_model: Model,
                                                                             tmp_path: Path) -> None:
    picture = _picture(tmp_path / "kestrel.png")
    url = "data:image/png;base64," + base64.b64encode(picture.read_bytes()).decode()
    with trio.fail_after(90):
        async with running_server(vl_model) as server:
            await browser.open_chat(server.port)
            assert await browser.js("return !document.getElementById('attach-label').hidden")
            await browser.set_setting("#temperature", "0")
            await browser.set_setting("#max-tokens", "4")
            await browser.send(QUESTION)
            text_only = await browser.answer_finished(1)
            await browser.click("#new-chat")
            await browser.type_into("#attach", str(picture), clear=False)
            await browser.until("return document.querySelectorAll('#attachments img').length === 1")
            await browser.send(QUESTION)
            with_image = await browser.answer_finished(1)
            shown = await browser.js("""const img = document.querySelector('article.user .images img');
                return img && img.src.startsWith('data:image/png;base64,') && img.naturalWidth""")
            left = await browser.js("return document.querySelectorAll('#attachments img').length")
            direct = await fetch(server.port, "POST", "/v1/chat/completions", {
                "model": vl_model.name, "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                          {"type": "text", "text": QUESTION}]}]},
                headers=(("content-type", "application/json"),))
    assert text_only["state"] == with_image["state"] == "done", with_image
    assert shown == 64 and left == 0  # shown in the conversation, cleared from the composer
    # The server counted the image's tokens: exactly what the same image sent by hand costs.
    assert direct.status == 200, direct.body
    assert with_image["prompt_tokens"] == direct.json()["usage"]["prompt_tokens"] > text_only["prompt_tokens"]
