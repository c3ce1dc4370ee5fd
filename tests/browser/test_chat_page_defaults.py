"""The chat page learns the server's sampling defaults from /v1/models, shows them whole, and leaves them to it."""

from __future__ import annotations

import trio

from kestrel_trio import SamplingDefaults
from kestrel_trio.model import Model

from browser_kit import Browser
from server_kit import running_server

# Each settings field's placeholder, and whether its text fits the field's content box (Chromium's number
# spinner, shown on hover, takes about 15 px of it: counted as taken).
PLACEHOLDERS = """
    const fits = {};
    const shown = {};
    const canvas = document.createElement('canvas').getContext('2d');
    for (const id of ['temperature', 'top-p', 'max-tokens']) {
        const input = document.getElementById(id);
        const style = getComputedStyle(input);
        canvas.font = style.font;
        const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight) - 16;
        shown[id] = input.placeholder;
        fits[id] = input.placeholder !== '' && canvas.measureText(input.placeholder).width <= room;
    }
    return {shown, fits, title: document.getElementById('temperature').title};
"""


async def test_the_settings_show_the_servers_defaults_whole_and_an_empty_field_leaves_them_to_it(
        browser: Browser, demo_model: Model) -> None:
    with trio.fail_after(120):
        async with running_server(demo_model, sampling_defaults=SamplingDefaults(temperature=0.3, top_p=0.8)) \
                as server:
            await browser.open_chat(server.port)
            await browser.click("#settings-toggle")
            page = await browser.js(PLACEHOLDERS)
            await browser.send("Hello")
            answer = await browser.answer_finished(1)
        async with running_server(demo_model, default_max_tokens=0) as server:
            await browser.open_chat(server.port)
            await browser.click("#settings-toggle")
            unbounded = await browser.js(PLACEHOLDERS)
            await browser.blank()
    assert page["shown"] == {"temperature": "0.3", "top-p": "0.8", "max-tokens": "256"}  # the demo model's cap
    assert page["title"] == "server default: 0.3"
    assert all(page["fits"].values()), page
    # Nothing typed: the page sends no max_tokens, and the server's default ends the answer (the demo model never
    # writes an end token).
    assert answer["state"] == "done" and answer["completion_tokens"] == 256, answer
    assert unbounded["shown"] == {"temperature": "1", "top-p": "1", "max-tokens": "context"}
    assert all(unbounded["fits"].values()), unbounded
