"""Images through the Responses API: ``input_image`` parts reach the tiny Qwen3-VL fixture as chat's image parts do.

The prompt is the fixture generator's (text, the image, text), sent as Responses input items; the prompt's token
count (image pads expanded) and the greedy answer are checked against transformers' goldens
(tests/fixtures/make_vl_fixtures.py).
"""

from __future__ import annotations

import base64

import openai
import pytest
import trio

from kestrel_trio.model import Model
from kestrel_trio.text import IncrementalDetokenizer

from server_kit import running_server
from slow_host import allowance

pytest.importorskip("PIL.Image")

NEW_TOKENS = 16  # the goldens' greedy length


async def test_an_input_image_is_read_as_chats_image_part(vl_model: Model, golden) -> None:
    url = "data:image/png;base64," + base64.b64encode(bytes(golden["image_bytes_up"])).decode()
    content = [{"type": "input_text", "text": "Look: "}, {"type": "input_image", "image_url": url, "detail": "auto"},
               {"type": "input_text", "text": "What is the weather today?"}]
    detokenizer = IncrementalDetokenizer(vl_model.tokenizer)
    golden_ids = golden["image_greedy_ids"].tolist()
    with trio.fail_after(allowance(120)):
        async with running_server(vl_model) as server:
            def work():
                with openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0,
                                   timeout=allowance(60)) as client:
                    return client.responses.create(model=server.state.model_id, instructions="You are a helpful "
                                                   "assistant.", input=[{"role": "user", "content": content}],
                                                   temperature=0, max_output_tokens=NEW_TOKENS)

            response = await trio.to_thread.run_sync(work)
    assert response.usage.input_tokens == golden["image_input_ids"].size  # the image's pad run is in the prompt
    # The golden ran with ignore_eos, which Responses lacks; it holds no end-of-turn token, so the same 16 come.
    assert not set(golden_ids) & set(vl_model.tokenizer.eos_token_ids)
    expected = "".join(detokenizer.push(token) for token in golden_ids) + detokenizer.flush(cut=True)
    assert response.output_text == expected and response.usage.output_tokens == NEW_TOKENS
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
