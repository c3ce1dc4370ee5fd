"""An image request through the official OpenAI client to a server on the Qwen3-VL GGUF pair (LM + mmproj).

The expected answer is the pair's own greedy continuation, computed here without the server from the same
image through the text layer's preprocessing (the pair's logits against transformers are
tests/gguf_in/test_vl_gguf.py's).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trio

from kestrel_trio.errors import ModelLoadError
from kestrel_trio.model import Model, load_model
from kestrel_trio.server import serve
from kestrel_trio.text.media.images import expand_image_pads, preprocess_image

from server_kit import assert_envelope, fetch, running_server
from test_vl_server import NEW_TOKENS, chat, cut_text, data_url, messages

pytest.importorskip("PIL.Image")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LM = FIXTURES / "qwen3_vl_gguf" / "lm-f16.gguf"
MMPROJ = FIXTURES / "qwen3_vl_gguf" / "mmproj-q8_0.gguf"


@pytest.fixture(scope="module")
def pair() -> Model:
    return load_model(LM, mmproj=MMPROJ)


def expected_answer(model: Model, image: bytes) -> tuple[list[int], int]:
    """(greedy ids, prompt length) of the fixture prompt with ``image``, from the model without a server."""
    vl = model.vision
    processed = preprocess_image(image, model.image_config, max_bytes=len(image), max_pixels=10**6)
    ids = model.encode(model.apply_chat_template(messages("x")))
    ids = expand_image_pads(ids, vl.config.image_token_id, [processed.num_tokens])
    prompt = vl.prepare(np.array(ids), processed.pixel_values, np.array([processed.grid_thw]))
    cache = vl.new_cache()
    tokens = [int(np.argmax(vl.prefill(cache, prompt)))]
    while len(tokens) < NEW_TOKENS:
        tokens.append(int(np.argmax(vl.step(cache, np.array([tokens[-1]]), prompt.rope_delta))))
    return tokens, len(ids)


async def test_an_image_request_on_the_gguf_pair(pair: Model, golden) -> None:
    image = bytes(golden["image_bytes_up"])
    tokens, prompt_len = expected_answer(pair, image)
    with trio.fail_after(60):
        async with running_server(str(LM), mmproj=str(MMPROJ)) as server:
            assert server.state.accepts_images
            text, finish, usage = await trio.to_thread.run_sync(
                lambda: chat(server, messages(data_url(image)), stream=True))
    assert text == cut_text(pair, tokens) and finish == "length"
    assert usage.prompt_tokens == prompt_len and usage.completion_tokens == NEW_TOKENS


async def test_an_image_to_the_language_model_alone_is_a_400() -> None:
    with trio.fail_after(60):
        async with running_server(str(LM)) as server:
            msgs = messages(data_url(b"\x89PNG not really"))
            response = await fetch(server.port, "POST", "/v1/chat/completions",
                                   {"model": server.state.model_id, "messages": msgs, "max_tokens": 2})
    error = assert_envelope(response, 400)
    assert "does not accept images" in error["message"]


async def test_serve_refuses_a_pair_that_does_not_fit_before_binding() -> None:
    text_model = FIXTURES / "gguf" / "qwen3_quant" / "qwen3_quant.gguf"
    with trio.fail_after(60):
        with pytest.raises(ModelLoadError, match="an mmproj file needs a Qwen3-VL language model"):
            await serve(str(text_model), port=0, mmproj=str(MMPROJ))  # raises before anything listens
        with pytest.raises(ModelLoadError, match="mmproj goes with a GGUF language model file"):
            await serve(None, port=0, mmproj=str(MMPROJ))
