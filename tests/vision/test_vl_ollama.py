"""Images through Ollama's ``/api/chat`` and ``/api/generate`` on the tiny Qwen3-VL, with the ollama client.

Ollama's ``images`` (base64) are the same image parts as OpenAI's ``image_url`` data URLs, placed before the
turn's text: the greedy answer must equal the OpenAI route's for the same image and text.
"""

from __future__ import annotations

import base64

import ollama
import pytest
import trio

from kestrel_trio.model import Model

from server_kit import HOST, client_for, running_server
from slow_host import allowance

TEXT = "What is the weather today?"
NEW_TOKENS = 8


async def test_ollama_images_answer_as_the_openai_route_does(vl_model: Model, golden) -> None:
    png = bytes(golden["image_bytes_up"])
    b64 = base64.b64encode(png).decode()
    with trio.fail_after(allowance(120)):
        async with running_server(vl_model) as server:
            def work():
                with client_for(server) as client:
                    reference = client.chat.completions.create(
                        model=server.state.model_id, temperature=0, max_tokens=NEW_TOKENS,
                        extra_body={"ignore_eos": True},
                        messages=[{"role": "user", "content": [
                            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
                            {"type": "text", "text": TEXT}]}])
                with ollama.Client(host=f"http://{HOST}:{server.port}", timeout=allowance(30)) as client:
                    options = {"temperature": 0, "num_predict": NEW_TOKENS}
                    chat = client.chat(model=server.state.model_id, options=options,
                                       messages=[{"role": "user", "content": TEXT, "images": [png]}])
                    generated = client.generate(model=server.state.model_id, prompt=TEXT, images=[b64],
                                                options=options)
                    with pytest.raises(ollama.ResponseError) as refused:
                        client.chat(model=server.state.model_id, messages=[
                            {"role": "user", "content": TEXT, "images": [base64.b64encode(b"not an image").decode()]}])
                return reference, chat, generated, refused.value

            reference, chat, generated, refused = await trio.to_thread.run_sync(work)
    assert reference.usage.prompt_tokens > len(vl_model.encode(TEXT)) + 16  # the image's pad run is in the prompt
    answer = reference.choices[0].message.content
    assert chat.message.content == answer and chat.prompt_eval_count == reference.usage.prompt_tokens
    assert generated.response == answer
    assert refused.status_code == 400 and "image" in refused.error
