"""A page on another origin (a second web server on another port) calling the API from headless Chromium.

Allowed by ``cors_origins``, it streams a chat answer, with the API key it sends
itself; a wrong key's 401 is readable too. Not allowed, the browser's preflight
is refused and the POST is never sent: no generation starts.
"""

from __future__ import annotations

import trio

from kestrel_trio.model import Model

from browser_kit import Browser, send_body, web_site
from server_kit import running_server

KEY = "sesame"

# The other site's page: stream one chat completion from the server named in its query string.
CALLER = b"""<!doctype html>
<title>another site</title>
<pre id="out"></pre>
<p id="status">running</p>
<script>
(async () => {
  const query = new URLSearchParams(location.search);
  const status = document.getElementById("status");
  const out = document.getElementById("out");
  try {
    const response = await fetch(query.get("api") + "/v1/chat/completions", {
      method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer " + query.get("key")},
      body: JSON.stringify({model: query.get("model"), messages: [{role: "user", content: "Hi"}],
                            max_tokens: 6, temperature: 0, stream: true}),
    });
    status.dataset.http = response.status;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let reads = 0;
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      reads += 1;
      out.textContent += decoder.decode(value, {stream: true});
    }
    status.dataset.reads = reads;
    status.textContent = "done";
  } catch (error) {
    status.textContent = "failed: " + error.name + ": " + error.message;
  }
})();
</script>
"""


def _caller_site():
    return web_site({"/caller.html": lambda handler: send_body(handler, 200, "text/html; charset=utf-8", CALLER)})


async def _call_from(browser: Browser, site: str, port: int, model: str, key: str = KEY) -> dict:
    await browser.open(f"{site}/caller.html?api=http://127.0.0.1:{port}&key={key}&model={model}")
    await browser.until("return document.getElementById('status').textContent !== 'running'")
    return await browser.js("""const s = document.getElementById('status');
        return {status: s.textContent, http: Number(s.dataset.http), out: document.getElementById('out').textContent}""")


async def test_an_allowed_origin_streams_with_its_key_and_reads_a_401(browser: Browser, demo_model: Model) -> None:
    with _caller_site() as site, trio.fail_after(60):
        async with running_server(demo_model, api_key=KEY, cors_origins=[site]) as server:
            streamed = await _call_from(browser, site, server.port, demo_model.name)
            refused = await _call_from(browser, site, server.port, demo_model.name, key="wrong")
            accepted = server.engine.metrics.accepted.value()
    assert streamed["status"] == "done" and streamed["http"] == 200, streamed
    events = [line for line in streamed["out"].split("\n\n") if line]
    assert events[-1] == "data: [DONE]" and len(events) >= 4
    assert '"chat.completion.chunk"' in events[0]
    assert refused["status"] == "done" and refused["http"] == 401  # the error is readable: it carries CORS headers
    assert "API key" in refused["out"]
    assert accepted == 1


async def test_an_origin_not_allowed_is_blocked_before_anything_runs(browser: Browser, demo_model: Model) -> None:
    with _caller_site() as site, trio.fail_after(60):
        async with running_server(demo_model, api_key=KEY, cors_origins=["http://127.0.0.1:1"]) as server:
            blocked = await _call_from(browser, site, server.port, demo_model.name)
            console = await browser.console()
            accepted = server.engine.metrics.accepted.value()
            steps = server.engine.metrics.steps.value()
    assert blocked["status"].startswith("failed: TypeError"), blocked
    assert blocked["out"] == ""
    assert any("CORS policy" in entry["message"] for entry in console), console
    assert accepted == 0 and steps == 0  # the preflight was refused: the POST never came


async def test_without_any_cors_origin_other_pages_are_blocked(browser: Browser, demo_model: Model) -> None:
    with _caller_site() as site, trio.fail_after(60):
        async with running_server(demo_model) as server:
            blocked = await _call_from(browser, site, server.port, demo_model.name)
            accepted = server.engine.metrics.accepted.value()
    assert blocked["status"].startswith("failed: TypeError"), blocked
    assert accepted == 0
