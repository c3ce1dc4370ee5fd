"""A max_tokens cut inside a multi-byte character sends no U+FFFD, streamed or not, chat or completions.

The demo model has Qwen3's byte-level vocabulary, where one token holds the
first three bytes of many emoji (F0 9F 98); a logit_bias makes the model
pick it, and max_tokens=1 cuts the answer right after it.
"""

from __future__ import annotations

import json

import pytest
import trio

from kestrel_trio.model import Model

from server_kit import fetch, running_server


def partial_emoji_token(model: Model) -> int:
    tokenizer = model.require_tokenizer()
    return next(i for i in range(tokenizer.vocab_size) if tokenizer.token_bytes(i) == "😀".encode()[:3])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_cut_inside_an_emoji_sends_no_replacement_character(demo_model: Model, path: str) -> None:
    token = partial_emoji_token(demo_model)
    body = {"max_tokens": 1, "temperature": 0, "logit_bias": {str(token): 100}}
    body.update({"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"})
    with trio.fail_after(60):
        async with running_server(demo_model) as server:
            whole = await fetch(server.port, "POST", path, body)
            streamed = await fetch(server.port, "POST", path, {**body, "stream": True})
    assert whole.status == 200 and streamed.status == 200, (whole.body, streamed.body)
    answer = whole.json()
    choice = answer["choices"][0]
    text = choice["message"]["content"] if "chat" in path else choice["text"]
    assert answer["usage"]["completion_tokens"] == 1 and choice["finish_reason"] == "length"
    assert text == ""  # the emoji's first three bytes are dropped, not sent as "\ufffd"
    chunks = [json.loads(payload) for payload in streamed.sse_payloads()[:-1]]
    pieces = [c["choices"][0]["delta"].get("content") or "" if "chat" in path else c["choices"][0]["text"]
              for c in chunks if c["choices"]]
    assert "".join(pieces) == ""
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
