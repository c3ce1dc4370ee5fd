"""How long a request that sets no max_tokens generates: the server's default cap, a cap chosen, OpenAI's defaults
(cap 0), the demo model's cap."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import trio

from kestrel_trio.model import Model, load_demo_model
from kestrel_trio.server import DEFAULT_CHAT_MAX_TOKENS, DEMO_DEFAULT_MAX_TOKENS

from server_kit import fetch, running_server

# ignore_eos: the fixture model may end early; these tests are about where it must stop.
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "ignore_eos": True}
COMPLETION = {"prompt": "Once", "temperature": 0, "ignore_eos": True}


async def generated(port: int, path: str, body: dict) -> tuple[int, str]:
    response = await fetch(port, "POST", path, body)
    assert response.status == 200, response.body
    answer = response.json()
    return answer["usage"]["completion_tokens"], answer["choices"][0]["finish_reason"]


async def test_a_chat_without_max_tokens_stops_at_the_default_cap_not_at_the_end_of_the_context() -> None:
    model = load_demo_model()
    model.name = "demo-weights-served-as-a-real-model"  # a model with an 8,192-token context and no end token
    assert not model.is_demo and model.context_length > 4 * DEFAULT_CHAT_MAX_TOKENS
    with trio.fail_after(300):  # without a default cap this chat runs to the end of 8,192 tokens
        async with running_server(model) as server:
            card = (await fetch(server.port, "GET", "/v1/models")).json()["data"][0]
            chat = await generated(server.port, "/v1/chat/completions", CHAT)
            completion = await generated(server.port, "/v1/completions", COMPLETION)
    assert chat == (DEFAULT_CHAT_MAX_TOKENS, "length") and 512 <= DEFAULT_CHAT_MAX_TOKENS <= 2048
    assert completion == (16, "length")  # OpenAI's completions default stays
    assert card["sampling_defaults"]["max_tokens"] == DEFAULT_CHAT_MAX_TOKENS  # what the chat page shows


async def test_a_cap_of_0_gives_openai_defaults_completions_16_chat_up_to_the_context(tiny_model: Model) -> None:
    with trio.fail_after(60):
        async with running_server(tiny_model, default_max_tokens=0) as server:
            card = (await fetch(server.port, "GET", "/v1/models")).json()["data"][0]
            completion = await generated(server.port, "/v1/completions", COMPLETION)
            prompt_tokens = (await fetch(server.port, "POST", "/tokenize", {"messages": CHAT["messages"]})).json()
            chat = await generated(server.port, "/v1/chat/completions", CHAT)
    assert completion == (16, "length")
    assert chat == (tiny_model.context_length - prompt_tokens["count"], "length")
    assert card["sampling_defaults"]["max_tokens"] is None


@pytest.mark.parametrize(("cap", "chat_tokens", "completion_tokens"), [(5, 5, 5), (40, 40, 16)])
async def test_the_server_cap_bounds_requests_without_max_tokens_and_never_raises_16(
    tiny_model: Model, cap: int, chat_tokens: int, completion_tokens: int,
) -> None:
    with trio.fail_after(60):
        async with running_server(tiny_model, default_max_tokens=cap) as server:
            chat = await generated(server.port, "/v1/chat/completions", CHAT)
            completion = await generated(server.port, "/v1/completions", COMPLETION)
            streamed = await fetch(server.port, "POST", "/v1/completions", {**COMPLETION, "stream": True})
            asked = await generated(server.port, "/v1/chat/completions", {**CHAT, "max_completion_tokens": 50})
            asked_legacy = await generated(server.port, "/v1/completions", {**COMPLETION, "max_tokens": 50})
    assert chat == (chat_tokens, "length") and completion == (completion_tokens, "length")
    texts = [json.loads(p)["choices"][0]["text"] for p in streamed.sse_payloads()[:-1]]
    assert len([t for t in texts if t]) <= completion_tokens  # the stream stops at the same place
    assert asked == asked_legacy == (50, "length")  # a request's own max_tokens is never capped


async def test_a_cap_larger_than_the_room_left_shrinks_to_it_instead_of_refusing(tiny_model: Model) -> None:
    with trio.fail_after(60):
        async with running_server(tiny_model, default_max_tokens=10_000) as server:
            prompt_tokens = (await fetch(server.port, "POST", "/tokenize", {"messages": CHAT["messages"]})).json()
            chat = await generated(server.port, "/v1/chat/completions", CHAT)
    assert chat == (tiny_model.context_length - prompt_tokens["count"], "length")


async def test_the_demo_model_caps_chat_at_a_few_hundred_tokens(demo_model: Model) -> None:
    with trio.fail_after(120):  # without the cap this chat runs to the end of 8,192 tokens
        async with running_server(demo_model) as server:
            chat = await generated(server.port, "/v1/chat/completions", CHAT)
            completion = await generated(server.port, "/v1/completions", COMPLETION)
        async with running_server(demo_model, default_max_tokens=7) as server:
            chosen = await generated(server.port, "/v1/chat/completions", CHAT)
    assert chat == (DEMO_DEFAULT_MAX_TOKENS, "length") and 100 <= DEMO_DEFAULT_MAX_TOKENS <= 500
    assert completion == (16, "length")
    assert chosen == (7, "length")  # the operator's cap wins over the demo's


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_default_max_tokens_flag_caps_a_real_server(tmp_path: Path) -> None:
    port = _free_port()
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "kestrel_trio.cli", "serve", "--port", str(port),
                                "--default-max-tokens", "3"], stdout=log, stderr=log,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as health:
                    if json.load(health)["status"] == "ok":
                        break
            except OSError:
                pass
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(CHAT).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()
    assert answer["usage"]["completion_tokens"] == 3 and answer["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("cap", [-1, 2.5, True])
async def test_a_cap_that_is_not_a_count_of_tokens_is_refused_before_anything_starts(tiny_model: Model, cap) -> None:
    from kestrel_trio.errors import KestrelError
    from kestrel_trio.server import serve

    with pytest.raises(KestrelError, match=r"default_max_tokens must be a count of tokens \(0 for no cap\)"):
        await serve(tiny_model, port=0, default_max_tokens=cap)
