"""The built-in chat page in headless Chromium against the real server and the demo model.

Each test serves on 127.0.0.1 port 0 (a new origin, so the page's storage starts empty)
and drives the page as a person would: typing, clicking Send and Stop.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import trio

from kestrel_trio.engine import EngineLimits
from kestrel_trio.model import Model

from browser_kit import Browser
from server_kit import fetch, running_server

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "webui.png"


async def _metric(port: int, line_start: str) -> float:
    """A sample of /metrics (0 if absent), e.g. ``kestrel:request_cancelled_total{phase="decode"}``."""
    text = (await fetch(port, "GET", "/metrics")).body.decode()
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _tokens_of(port: int, messages: list[dict]) -> int:
    """The prompt tokens the server counts for ``messages`` (its own /tokenize, chat template applied)."""
    answer = await fetch(port, "POST", "/tokenize", {"messages": messages, "add_generation_prompt": True},
                         headers=(("content-type", "application/json"),))
    assert answer.status == 200, answer.body
    return answer.json()["count"]


async def test_the_page_loads_under_its_csp_and_shows_the_model(browser: Browser, demo_model: Model) -> None:
    with trio.fail_after(60):
        async with running_server(demo_model) as server:
            await browser.open_chat(server.port)
            page = await browser.js("""
                const style = getComputedStyle(document.querySelector('header'));
                const inline = document.createElement('script');
                inline.textContent = 'window.inlineRan = true';
                document.body.append(inline);
                return {title: document.title, model: document.getElementById('model').textContent,
                        attach: !document.getElementById('attach-label').hidden,
                        send: !document.getElementById('send').disabled,
                        stop: !document.getElementById('stop').disabled,
                        styled: style.position, inlineRan: window.inlineRan === true};
            """)
            console = await browser.console()
    assert page["title"] == "kestrel-trio"
    assert page["model"] == demo_model.name
    assert page["attach"] is False  # the demo model takes no images
    assert page["send"] is True and page["stop"] is False
    assert page["styled"] == "sticky"  # the stylesheet loaded
    assert page["inlineRan"] is False  # the CSP refuses inline script
    errors = [entry["message"] for entry in console if entry["level"] == "SEVERE"]
    # The only console error is the CSP refusing the inline script planted just above.
    assert len(errors) == 1 and "Content Security Policy" in errors[0], errors


async def test_an_answer_streams_into_the_page_in_several_updates(browser: Browser, demo_model: Model, gate) -> None:
    with trio.fail_after(90):
        async with running_server(demo_model) as server:
            await browser.open_chat(server.port)
            await browser.set_setting("#temperature", "0")
            await browser.set_setting("#max-tokens", "24")
            seen: list[str] = []
            with gate.held():
                await browser.send("Tell me about kestrels.")
                await browser.until("return document.querySelector('article.assistant') !== null")
                while len(seen) < 3:
                    gate.allow(1)  # one model step: at most one more token
                    with trio.move_on_after(3):  # a token may add no text (a partial UTF-8 sequence)
                        while (await browser.last_answer())["text"] == (seen[-1] if seen else ""):
                            await trio.sleep(0.02)
                    answer = await browser.last_answer()
                    assert answer["state"] == "streaming"  # still mid-answer: the gate holds the next step
                    assert await browser.js("return document.getElementById('stop').disabled") is False
                    if answer["text"] and answer["text"] != (seen[-1] if seen else ""):
                        seen.append(answer["text"])
            final = await browser.answer_finished(1)
    assert final["state"] == "done", final
    assert final["completion_tokens"] == 24
    assert len(seen) == 3 and all(final["text"].startswith(partial) for partial in seen)
    assert len(seen[0]) < len(seen[1]) < len(seen[2]) <= len(final["text"])


async def test_stop_aborts_the_request_and_the_server_cancels_the_generation(browser: Browser,
                                                                             demo_model: Model) -> None:
    cancelled = 'kestrel:request_cancelled_total{phase="decode"}'
    with trio.fail_after(90):
        async with running_server(demo_model) as server:
            await browser.open_chat(server.port)
            await browser.set_setting("#max-tokens", "4000")
            assert await _metric(server.port, cancelled) == 0
            await browser.send("Write a very long story.")
            await browser.until("""const c = document.querySelector('article.assistant .content');
                                   return c && c.textContent.length > 5""")
            await browser.click("#stop")
            stopped = await browser.answer_finished(1)
            while await _metric(server.port, cancelled) != 1:
                await trio.sleep(0.05)
            while server.engine.active:
                await trio.sleep(0.05)
            generated = server.engine.metrics.generation_tokens.value()
            buttons = await browser.js("return [document.getElementById('send').disabled, "
                                       "document.getElementById('stop').disabled]")
    assert stopped["state"] == "stopped" and stopped["content"] and "stopped" in stopped["text"]
    assert generated < 4000
    assert buttons == [False, True]


async def test_a_second_turn_sends_the_whole_conversation(browser: Browser, demo_model: Model) -> None:
    system = "You are a terse assistant."
    with trio.fail_after(90):
        async with running_server(demo_model) as server:
            await browser.open_chat(server.port)
            await browser.set_setting("#system-prompt", system)
            await browser.set_setting("#temperature", "0")
            await browser.set_setting("#max-tokens", "8")
            await browser.send("What is a kestrel?")
            first = await browser.answer_finished(1)
            await browser.send("And where do they live?")
            second = await browser.answer_finished(2)
            turn_one = [{"role": "system", "content": system}, {"role": "user", "content": "What is a kestrel?"}]
            expected_first = await _tokens_of(server.port, turn_one)
            expected_second = await _tokens_of(server.port, turn_one + [
                {"role": "assistant", "content": first["content"]},
                {"role": "user", "content": "And where do they live?"}])
    assert first["state"] == second["state"] == "done"
    assert first["content"], "the first answer had no content to carry into the second turn"
    # What the server counted as each prompt is exactly the conversation so far, system prompt included.
    assert first["prompt_tokens"] == expected_first
    assert second["prompt_tokens"] == expected_second
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["completion_tokens"] - 1


async def test_new_chat_forgets_the_conversation(browser: Browser, demo_model: Model) -> None:
    with trio.fail_after(90):
        async with running_server(demo_model) as server:
            await browser.open_chat(server.port)
            await browser.set_setting("#temperature", "0")
            await browser.set_setting("#max-tokens", "4")
            await browser.send("Hello there")
            first = await browser.answer_finished(1)
            await browser.click("#new-chat")
            assert await browser.answers() == 0
            # New chat in the middle of an answer: that answer ends, and is no part of the new conversation.
            await browser.set_setting("#max-tokens", "4000")
            await browser.send("Write a very long story.")
            await browser.until("""const c = document.querySelector('article.assistant .content');
                                   return c && c.textContent.length > 5""")
            await browser.click("#new-chat")
            await browser.until("return document.body.dataset.busy === 'false'")
            assert await browser.answers() == 0
            await browser.set_setting("#max-tokens", "4")
            await browser.send("Hello there")
            again = await browser.answer_finished(1)
    assert again["prompt_tokens"] == first["prompt_tokens"]
    assert again["content"] == first["content"]  # greedy, same prompt: the history really was dropped


async def test_the_page_asks_for_the_api_key_and_sends_it(browser: Browser, demo_model: Model) -> None:
    with trio.fail_after(90):
        async with running_server(demo_model, api_key="sesame") as server:
            await browser.open(f"http://127.0.0.1:{server.port}/")
            await browser.until("return document.getElementById('key-dialog').open")
            await browser.type_into("#api-key", "wrong")
            await browser.click("#key-save")
            # The server said 401 again: the page asks again and shows why.
            error = await browser.until("""const e = document.getElementById('key-error');
                const d = document.getElementById('key-dialog');
                return d.open && !e.hidden && e.textContent""")
            await browser.type_into("#api-key", "sesame")
            await browser.click("#key-save")
            await browser.until("return document.body.dataset.model === 'ready'")
            await browser.set_setting("#max-tokens", "4")
            await browser.send("Hi")
            answer = await browser.answer_finished(1)
            stored = await browser.js("return [sessionStorage.getItem('kestrel-trio.api-key'), "
                                      "localStorage.getItem('kestrel-trio.api-key')]")
    assert "API key" in error
    assert answer["state"] == "done" and answer["completion_tokens"] == 4
    assert stored == ["sesame", None]  # for this tab only, unless "remember" is ticked


async def test_the_servers_error_message_is_shown(browser: Browser, demo_model: Model) -> None:
    with trio.fail_after(60):
        async with running_server(demo_model) as server:
            await browser.open_chat(server.port)
            await browser.set_setting("#max-tokens", "100000")
            await browser.send("Hi")
            answer = await browser.answer_finished(1)
            direct = await fetch(server.port, "POST", "/v1/chat/completions", {
                "model": demo_model.name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100000,
                "stream": True}, headers=(("content-type", "application/json"),))
            page = await browser.js("return [document.getElementById('prompt').value, "
                                    "document.querySelector('article.user').classList.contains('dropped')]")
    assert answer["state"] == "error"
    assert answer["errors"] == [direct.json()["error"]["message"]]
    assert "context length" in answer["errors"][0]
    assert page == ["Hi", True]  # the message is back in the box, and out of the conversation


async def test_a_screenshot_of_the_page_for_the_docs(browser: Browser, demo_model: Model, tmp_path: Path) -> None:
    """Writes docs/webui.png when KESTREL_WRITE_SCREENSHOT=1 (otherwise a temporary file), and checks it."""
    target = DOCS_SCREENSHOT if os.environ.get("KESTREL_WRITE_SCREENSHOT") == "1" else tmp_path / "webui.png"
    with trio.fail_after(90):
        async with running_server(demo_model) as server:
            await browser.open_chat(server.port)
            await browser.set_setting("#system-prompt", "You are a helpful assistant on a small ARM board.")
            await browser.set_setting("#temperature", "0.7")
            await browser.set_setting("#max-tokens", "48")
            await browser.click("#settings-toggle")  # fold the settings away again
            await browser.send("Hello! What can you tell me about kestrels?")
            await browser.answer_finished(1)
            await browser.type_into("#prompt", "And how fast can they fly?")
            await browser.screenshot(target)
    from PIL import Image

    with Image.open(target) as image:
        assert image.format == "PNG" and image.size[0] >= 800 and image.size[1] >= 600
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 20  # a rendered page, not a blank window
