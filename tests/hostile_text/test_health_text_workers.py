"""/health tells the truth about stuck text workers (issue 49): a template render, tokenization or grammar
compile running past its deadline makes it say "stalled" (503), as a stalled engine step does."""

from __future__ import annotations

import threading

import trio

from kestrel_trio.model import Model
from server_kit import fetch, running_server


async def test_health_is_503_while_a_text_worker_is_stuck(tiny_model: Model, monkeypatch) -> None:
    release = threading.Event()
    real = tiny_model.apply_chat_template

    def stuck(*args, **kwargs):
        release.wait(60)  # a template that never ends, as far as the server can tell
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny_model, "apply_chat_template", stuck)
    with trio.fail_after(60):
        async with running_server(tiny_model) as server:
            server.state.text_stall_seconds = 0.5
            before = await fetch(server.port, "GET", "/health")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fetch, server.port, "POST", "/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
                while not server.state.text_calls:
                    await trio.sleep(0.01)
                await trio.sleep(1.0)
                during = await fetch(server.port, "GET", "/health")
                release.set()
            after = await fetch(server.port, "GET", "/health")
    assert before.status == 200 and after.status == 200
    assert during.status == 503 and during.json()["status"] == "stalled"
    assert during.json()["text_workers"]["busy"] == 1
