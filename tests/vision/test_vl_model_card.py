"""/v1/models tells clients (the built-in chat page among them) that a Qwen3-VL model takes images."""

from __future__ import annotations

import trio

from kestrel_trio.model import Model

from server_kit import fetch, running_server


async def test_a_vision_model_lists_image_among_its_input_modalities(vl_model: Model) -> None:
    with trio.fail_after(30):
        async with running_server(vl_model) as server:
            listing = (await fetch(server.port, "GET", "/v1/models")).json()
    assert listing["data"][0]["input_modalities"] == ["text", "image"]
