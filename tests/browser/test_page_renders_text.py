"""Model output that looks like HTML shows as text and runs nothing.

The page's own files (from the package) are served by a stand-in site whose
chat endpoint streams a scripted answer: markup in the model id, in
``reasoning_content``, in ``content`` (split across chunks), in an SSE error
event and in an error envelope. The stand-in sends no Content-Security-Policy,
so the page's rendering alone stands between that markup and the DOM: had the
page parsed any of it as HTML, an ``onerror`` handler would run (the test checks
that it would, by parsing the same markup itself). The stream also uses CRLF
line ends and a comment line, as a proxy in front of a server might.
"""

from __future__ import annotations

import json
import time
from importlib import resources

import trio

from kestrel_trio.webui import PATHS

from browser_kit import Browser, read_body, send_body, web_site

MODEL_ID = "<img src=x onerror=\"window.pwned='model id'\">"
REASONING = "I think <img src=x onerror=\"window.pwned='reasoning'\"> is"
CONTENT_PARTS = ["Here: <img src=x oner", "ror=\"window.pwned='content'\"> and ",
                 "<script>window.pwned='script'</script> <b>bold</b> &amp; done"]
CONTENT = "".join(CONTENT_PARTS)
STREAM_ERROR = "<img src=x onerror=\"window.pwned='error event'\"> the engine failed"
ENVELOPE_ERROR = "<img src=x onerror=\"window.pwned='error envelope'\"> bad request"
# What the stand-in site serves each of the page's files as, by extension.
_CONTENT_TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}


def _event(obj: object, line_end: str = "\n") -> bytes:
    return f"data: {json.dumps(obj)}{line_end}{line_end}".encode()


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": MODEL_ID,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _first_answer() -> list[bytes]:
    events = [_event(_chunk({"role": "assistant", "content": ""})), b": a comment line\n\n"]
    events += [_event(_chunk({"reasoning_content": REASONING[:9]}), "\r\n"),
               _event(_chunk({"reasoning_content": REASONING[9:]}))]
    events += [_event(_chunk({"content": part}), "\r\n") for part in CONTENT_PARTS]
    events += [_event(_chunk({}, "stop")),
               _event({**_chunk({}), "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 11,
                                                               "total_tokens": 18}}),
               b"data: [DONE]\n\n"]
    # Split one event across two writes, in the middle of a CRLF pair.
    split = events[4]
    cut = split.index(b"\r\n") + 1
    return events[:4] + [split[:cut], split[cut:]] + events[5:]


def _second_answer() -> list[bytes]:
    return [_event(_chunk({"role": "assistant", "content": ""})), _event(_chunk({"content": "partial "})),
            _event({"error": {"message": STREAM_ERROR, "type": "server_error", "param": None, "code": None}}),
            b"data: [DONE]\n\n"]


class ScriptedSite:
    """The page's real files, /v1/models and a chat endpoint answering from a script, turn by turn."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        package = resources.files("kestrel_trio.webui")
        self.files = {}  # path -> (file in the package, Content-Type)
        for path in PATHS:
            name = "index.html" if path == "/" else path.removeprefix("/webui/")
            self.files[path] = (name, _CONTENT_TYPES[name.rpartition(".")[2]])
        self.bodies = {path: package.joinpath(name).read_bytes() for path, (name, _) in self.files.items()}

    def routes(self) -> dict:
        routes = {path: self._file(path) for path in self.files}
        routes["/v1/models"] = lambda handler: send_body(handler, 200, "application/json", json.dumps(
            {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "test",
                                         "input_modalities": ["text"]}]}).encode())
        routes["/v1/chat/completions"] = self._chat
        return routes

    def _file(self, path: str):
        return lambda handler: send_body(handler, 200, self.files[path][1], self.bodies[path])

    def _chat(self, handler) -> None:
        self.requests.append(json.loads(read_body(handler)))
        turn = len(self.requests)
        if turn == 3:
            envelope = {"error": {"message": ENVELOPE_ERROR, "type": "invalid_request_error", "param": None,
                                  "code": None}}
            send_body(handler, 400, "application/json", json.dumps(envelope).encode())
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        for piece in _first_answer() if turn == 1 else _second_answer():
            handler.wfile.write(piece)
            handler.wfile.flush()
            time.sleep(0.03)  # separate reads, as tokens arrive


async def test_markup_from_the_model_and_the_server_shows_as_text_and_runs_nothing(browser: Browser) -> None:
    site = ScriptedSite()
    with web_site(site.routes()) as origin, trio.fail_after(60):
        await browser.open(origin + "/")
        await browser.until("return document.body.dataset.model === 'ready'")
        await browser.send("Show me some HTML")
        first = await browser.answer_finished(1)
        await browser.send("And again")
        second = await browser.answer_finished(2)
        await browser.send("Once more")
        third = await browser.answer_finished(3)
        page = await browser.js("""return {pwned: window.pwned === undefined ? null : window.pwned,
            images: document.querySelectorAll('img').length, scripts: document.querySelectorAll('main script').length,
            bold: document.querySelectorAll('main b').length, model: document.getElementById('model').textContent,
            open: document.querySelector('article.assistant details.reasoning').open}""")
        # The control: the same markup, parsed as HTML in this page, does run.
        control = await browser.js("""
            const probe = document.createElement('div');
            probe.innerHTML = arguments[0];
            document.body.append(probe);""", MODEL_ID.replace("model id", "control"))
        ran = await browser.until("return window.pwned")
    assert control is None and ran == "control"
    assert page == {"pwned": None, "images": 0, "scripts": 0, "bold": 0, "model": MODEL_ID, "open": False}
    assert first["state"] == "done" and first["content"] == CONTENT
    assert first["reasoning"] == REASONING and first["reasoning_shown"]  # shown apart, folded once the answer began
    assert (first["prompt_tokens"], first["completion_tokens"]) == (7, 11)
    assert second["state"] == "error" and second["content"] == "partial " and second["errors"] == [STREAM_ERROR]
    assert third["state"] == "error" and third["errors"] == [ENVELOPE_ERROR]
    # The page sent proper OpenAI requests, the history included (the failed third turn had no answer to add).
    assert [request["messages"][-1]["content"] for request in site.requests] == [
        "Show me some HTML", "And again", "Once more"]
    assert site.requests[1]["messages"][:2] == [{"role": "user", "content": "Show me some HTML"},
                                               {"role": "assistant", "content": CONTENT}]
    assert all(request["stream"] is True and request["model"] == MODEL_ID for request in site.requests)
