"""Test support for the browser suites: headless Chromium under selenium, driven from trio; a second web site.

Selenium is blocking, so every WebDriver call runs in a worker thread
(``trio.to_thread.run_sync``) while the server under test keeps running in
trio. Waits poll the page and are bounded by each test's own ``fail_after``.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import trio

CHROMIUM_FLAGS = (
    # What works in this closed network: without the background-networking flags Chromium's own
    # connections (component updates, sync, QUIC probes) fail and its requests get refused.
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1100,800", "--lang=en-US",
)


def browser_missing() -> str | None:
    """Why no browser can run here (what to install), or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if shutil.which("chromium") is None:
        return "Debian's chromium is not installed (apt-get install chromium chromium-driver)"
    if shutil.which("chromedriver") is None:
        return "Debian's chromium-driver is not installed (apt-get install chromium chromium-driver)"
    return None


def require_browser() -> None:
    """Skip with the reason where the browser is missing; under ``CI=true`` fail instead."""
    reason = browser_missing()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}: CI=true requires the real browser tests to run")
    pytest.skip(reason)


def start_chromium(profile: Path):
    """A headless Chromium driven by Debian's chromedriver (given by path, so selenium never downloads one)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(service=service, options=options)


class Browser:
    """One Chromium window, with async methods that run each WebDriver call in a worker thread."""

    def __init__(self, driver) -> None:
        self.driver = driver

    async def _run(self, function: Callable, *args) -> Any:
        return await trio.to_thread.run_sync(function, *args)

    async def open(self, url: str) -> None:
        """Load ``url`` and forget the console messages so far."""
        await self._run(self.driver.get, url)

    async def js(self, script: str, *args) -> Any:
        """Run ``script`` as a function body in the page (``arguments`` holds ``args``); its return value."""
        return await self._run(self.driver.execute_script, script, *args)

    async def until(self, script: str, *args, interval: float = 0.02) -> Any:
        """Poll ``script`` until it returns something truthy; that value. The test's fail_after bounds it."""
        while True:
            value = await self.js(script, *args)
            if value:
                return value
            await trio.sleep(interval)

    async def type_into(self, css: str, text: str, clear: bool = True) -> None:
        def run():
            field = self.driver.find_element("css selector", css)
            if clear:
                field.clear()
            field.send_keys(text)

        await self._run(run)

    async def click(self, css: str) -> None:
        await self._run(lambda: self.driver.find_element("css selector", css).click())

    async def console(self) -> list[dict]:
        """The console messages since the last call (errors, CSP reports, failed loads)."""
        return await self._run(self.driver.get_log, "browser")

    async def screenshot(self, path: Path) -> None:
        await self._run(self.driver.save_screenshot, str(path))

    async def blank(self) -> None:
        """Leave the page (its fetches end), so the next test starts from nothing."""
        await self.open("about:blank")

    # -- the chat page ------------------------------------------------------

    async def open_chat(self, port: int) -> None:
        """Open the built-in page and wait until it has read the model list."""
        await self.open(f"http://127.0.0.1:{port}/")
        await self.until("return document.body.dataset.model === 'ready'")

    async def set_setting(self, css: str, value: str) -> None:
        """Type ``value`` into a settings field (opening the settings panel if needed)."""
        if await self.js("return document.getElementById('settings').hidden"):
            await self.click("#settings-toggle")
        await self.type_into(css, value)

    async def send(self, text: str) -> None:
        await self.type_into("#prompt", text)
        await self.click("#send")

    async def answers(self) -> int:
        return await self.js("return document.querySelectorAll('article.assistant').length")

    async def last_answer(self) -> dict:
        """The last assistant message: its state, texts and token counts, as the page shows them."""
        return await self.js("""
            const article = [...document.querySelectorAll('article.assistant')].pop();
            if (!article) return null;
            const errors = [...article.querySelectorAll('.error')].map((e) => e.textContent);
            return {state: article.dataset.state, content: article.querySelector('.content').textContent,
                    reasoning: article.querySelector('.reasoning-text').textContent,
                    reasoning_shown: !article.querySelector('.reasoning').hidden,
                    text: article.textContent, errors,
                    prompt_tokens: Number(article.dataset.promptTokens),
                    completion_tokens: Number(article.dataset.completionTokens)};
        """)

    async def answer_finished(self, count: int) -> dict:
        """Wait until the page shows ``count`` answers and the last one is no longer streaming; that answer."""
        await self.until("""
            const all = document.querySelectorAll('article.assistant');
            return all.length === arguments[0] && all[all.length - 1].dataset.state !== 'streaming'
                && document.body.dataset.busy === 'false';
        """, count)
        return await self.last_answer()


# -- a second web site, on another origin -------------------------------------

Route = Callable[[http.server.BaseHTTPRequestHandler], None]


@contextlib.contextmanager
def web_site(routes: dict[str, Route]) -> Iterator[str]:
    """A small web server on 127.0.0.1, port 0, in a thread; yields its origin (``http://127.0.0.1:PORT``).

    Each route writes its whole response (HTTP/1.0, closed after it). Unknown paths get 404.
    """

    class Handler(http.server.BaseHTTPRequestHandler):
        def _route(self) -> None:
            route = routes.get(self.path.partition("?")[0])
            if route is None:
                self.send_error(404)
                return
            route(self)

        do_GET = do_POST = _route

        def log_message(self, format, *args):  # keep the test output quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def send_body(handler: http.server.BaseHTTPRequestHandler, status: int, content_type: str, body: bytes,
              headers: tuple[tuple[str, str], ...] = ()) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in headers:
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def read_body(handler: http.server.BaseHTTPRequestHandler) -> bytes:
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
