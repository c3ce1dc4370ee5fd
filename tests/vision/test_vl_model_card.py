"""/v1/models tells clients (the built-in chat page among them) that a Qwen3-VL model takes images, and videos
when the server can decode video files (PyAV installed; tests/vision/test_video_server.py covers it absent)."""

from __future__ import annotations

import importlib.util

import trio

from kestrel_trio.model import Model

from server_kit import fetch, running_server


async def test_a_vision_model_lists_image_and_video_among_its_input_modalities(vl_model: Model) -> None:
    with trio.fail_after(30):
        async with running_server(vl_model) as server:
            listing = (await fetch(server.port, "GET", "/v1/models")).json()
    video = ["video"] if importlib.util.find_spec("av") is not None else []
    assert listing["data"][0]["input_modalities"] == ["text", "image", *video]
