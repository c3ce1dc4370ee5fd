"""The built-in chat page's files over raw sockets: types, security headers, HEAD, the API key, --no-webui.

What the page does is tested in a real browser (tests/browser); this checks what is served.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from importlib import resources

import pytest
import trio

from kestrel_trio.model import Model
from kestrel_trio.webui import PATHS

from server_kit import assert_envelope, connected, fetch, running_server

FILES = {
    "/": "text/html; charset=utf-8",
    "/webui/app.js": "text/javascript; charset=utf-8",
    "/webui/api.js": "text/javascript; charset=utf-8",
    "/webui/messages.js": "text/javascript; charset=utf-8",
    "/webui/style.css": "text/css; charset=utf-8",
    "/webui/icon.svg": "image/svg+xml",
}


# Every script the page serves (its ES modules), by file name in the package.
SCRIPTS = sorted(path.removeprefix("/webui/") for path in PATHS if path.endswith(".js"))
# The module specifiers of static imports and re-exports (`import ... from "./x.js"`, `import "./x.js"`).
IMPORT = re.compile(r"""^\s*(?:import|export)\s(?:[^;"'()]*?\bfrom\s*)?["']([^"']+)["']""", re.MULTILINE)


def _package_text(name: str) -> str:
    return resources.files("kestrel_trio.webui").joinpath(name).read_text(encoding="utf-8")


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.script_text = ""
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.script_text += data


async def test_each_file_has_its_type_a_strict_csp_and_nosniff(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            async with connected(server.port) as client:
                answers = {path: await client.request("GET", path) for path in FILES}
    for path, content_type in FILES.items():
        answer = answers[path]
        assert answer.status == 200, path
        assert answer.headers["content-type"] == content_type
        assert answer.headers["x-content-type-options"] == "nosniff"
        csp = {part.split()[0]: part.split()[1:] for part in answer.headers["content-security-policy"].split(";")
               if part.strip()}
        assert csp["default-src"] == ["'self'"]
        assert "script-src" not in csp  # scripts fall back to default-src: this server only, no inline
        assert not any("'unsafe-" in value for values in csp.values() for value in values)
        assert csp["frame-ancestors"] == ["'none'"] and csp["object-src"] == ["'none'"]
        assert answer.body  # served from package data
    assert b"<script" in answers["/"].body


async def test_head_gives_the_same_head_without_a_body(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            async with connected(server.port) as client:
                got = await client.request("GET", "/")
                head = await client.request("HEAD", "/")
    assert head.status == 200 and head.body == b""
    assert head.headers["content-length"] == str(len(got.body))
    assert head.headers["content-security-policy"] == got.headers["content-security-policy"]


async def test_the_page_needs_no_api_key_but_the_api_still_does(tiny_model: Model) -> None:
    auth = (("authorization", "Bearer sesame"),)
    with trio.fail_after(20):
        async with running_server(tiny_model, api_key="sesame") as server:
            pages = [await fetch(server.port, "GET", path) for path in FILES]
            models = await fetch(server.port, "GET", "/v1/models")
            with_key = await fetch(server.port, "GET", "/v1/models", headers=auth)
    assert [page.status for page in pages] == [200] * len(FILES)
    assert_envelope(models, 401)
    assert with_key.status == 200


async def test_no_webui_means_no_page(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model, webui=False) as server:
            answers = [await fetch(server.port, "GET", path) for path in FILES]
    for answer in answers:
        assert_envelope(answer, 404)


async def test_the_model_card_says_which_inputs_the_model_takes(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            listing = (await fetch(server.port, "GET", "/v1/models")).json()
    assert listing["data"][0]["input_modalities"] == ["text"]


def test_the_page_has_no_inline_script_style_or_handler_and_loads_nothing_remote():
    html = _package_text("index.html")
    parser = _Tags()
    parser.feed(html)
    scripts = [attrs for tag, attrs in parser.tags if tag == "script"]
    assert scripts and all(attrs.get("src", "").startswith("/webui/") for attrs in scripts)
    assert parser.script_text.strip() == ""
    assert not any(tag == "style" for tag, _ in parser.tags)
    for tag, attrs in parser.tags:
        assert not any(name.startswith("on") or name == "style" for name in attrs), (tag, attrs)
        for name in ("src", "href"):
            if name in attrs:
                assert attrs[name].startswith("/webui/"), (tag, attrs)
    assert [attrs.get("type") for attrs in scripts] == ["module"]  # one entry; it imports the other modules
    for name in ("index.html", "style.css", *SCRIPTS):
        text = _package_text(name)
        assert not re.search(r"""(["'(]|url\()\s*(https?:)?//""", text), name  # no remote URL of any kind
        assert "@import" not in text


def test_every_script_in_the_package_is_served_and_each_import_is_a_served_script():
    shipped = sorted(entry.name for entry in resources.files("kestrel_trio.webui").iterdir()
                     if entry.name.endswith(".js"))
    assert shipped == SCRIPTS  # a script left out of _FILES would be neither served nor checked below
    assert {f"/webui/{name}" for name in SCRIPTS} <= set(FILES)  # ... and each has its type and headers checked
    imported = set()
    for name in SCRIPTS:
        for specifier in IMPORT.findall(_package_text(name)):
            assert specifier.startswith("./") and specifier.removeprefix("./") in SCRIPTS, (name, specifier)
            imported.add(specifier.removeprefix("./"))
    assert imported == set(SCRIPTS) - {"app.js"}  # the entry imports the rest: none is dead


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("sink", ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                                  "new Function", "setAttribute(\"on", "DOMParser", "createContextualFragment",
                                  "import("])
def test_no_script_turns_text_into_markup_or_code(sink, script):
    assert sink not in _package_text(script)
