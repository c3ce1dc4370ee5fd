"""CORS through the real server over raw sockets: preflights, and the headers on every kind of response."""

from __future__ import annotations

import json

import pytest
import trio

from kestrel_trio.errors import KestrelError
from kestrel_trio.http import HttpLimits
from kestrel_trio.model import Model
from kestrel_trio.server import serve

from server_kit import HOST, RawResponse, assert_envelope, connected, fetch, running_server

PAGE = "http://127.0.0.1:3000"
OTHER = "http://127.0.0.1:3001"
KEY = "sesame"
AUTH = (("authorization", f"Bearer {KEY}"),)
JSON = (("content-type", "application/json"),)
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}


def _from(origin: str) -> tuple[tuple[str, str], ...]:
    return (("origin", origin),)


def _preflight_headers(origin: str = PAGE) -> tuple[tuple[str, str], ...]:
    return (("origin", origin), ("access-control-request-method", "POST"),
            ("access-control-request-headers", "authorization, content-type"))


def _cors_headers(response: RawResponse) -> dict[str, str]:
    return {name: value for name, value in response.headers.items() if name.startswith("access-control-")}


def _assert_allowed(response: RawResponse, origin: str = PAGE) -> None:
    assert response.headers.get("access-control-allow-origin") == origin, (response.status, response.headers)
    assert "origin" in response.headers.get("vary", "").lower()


async def _raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` and read what comes back until the server closes."""
    stream = await trio.open_tcp_stream(HOST, port)
    received = bytearray()
    async with stream:
        await stream.send_all(data)
        try:
            while chunk := await stream.receive_some(65536):
                received += chunk
        except trio.BrokenResourceError:
            pass  # a reset after the answer: what was read is the answer
    return bytes(received)


def _head_lines(raw: bytes) -> tuple[int, dict[str, str]]:
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in head[1:])
    return int(head[0].split()[1]), {name.lower(): value for name, value in fields.items()}


async def test_a_preflight_needs_no_api_key_and_lists_methods_headers_and_max_age(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model, api_key=KEY, cors_origins=[PAGE]) as server:
            answer = await fetch(server.port, "OPTIONS", "/v1/chat/completions", headers=_preflight_headers())
            assert server.engine.metrics.accepted.value() == 0
    assert answer.status == 204 and answer.body == b""
    _assert_allowed(answer)
    methods = {m.strip() for m in answer.headers["access-control-allow-methods"].split(",")}
    assert {"GET", "POST", "OPTIONS"} <= methods
    allowed = {h.strip().lower() for h in answer.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type"} <= allowed
    assert int(answer.headers["access-control-max-age"]) > 0
    # RFC 9110: a 204 has no Content-Length; nor does it need a Content-Type.
    assert "content-length" not in answer.headers and "content-type" not in answer.headers


async def test_every_kind_of_answer_to_an_allowed_origin_carries_its_cors_headers(tiny_model: Model) -> None:
    origin = _from(PAGE)
    with trio.fail_after(30):
        async with running_server(tiny_model, api_key=KEY, cors_origins=[PAGE, OTHER]) as server:
            async with connected(server.port) as client:
                answers = {
                    "models 200": await client.request("GET", "/v1/models", headers=origin + AUTH),
                    "health, no key needed, 200": await client.request("GET", "/health", headers=origin),
                    "missing key 401": await client.request("GET", "/v1/models", headers=origin),
                    "unknown path 404": await client.request("GET", "/nowhere", headers=origin + AUTH),
                    "wrong method 405": await client.request("GET", "/v1/chat/completions", headers=origin + AUTH),
                    "bad JSON 400": await client.request("POST", "/v1/chat/completions", b"{", origin + AUTH + JSON),
                    "chat 200": await client.request("POST", "/v1/chat/completions", json.dumps(CHAT).encode(),
                                                     origin + AUTH + JSON),
                }
            other = await fetch(server.port, "GET", "/v1/models", headers=_from(OTHER) + AUTH)
    for name, answer in answers.items():
        assert answer.status == int(name.rsplit(" ", 1)[1]), name
        _assert_allowed(answer)
    _assert_allowed(other, OTHER)  # each allowed origin gets its own name back


async def test_an_sse_stream_to_an_allowed_origin_carries_the_headers_on_its_head(tiny_model: Model) -> None:
    body = json.dumps({**CHAT, "stream": True}).encode()
    with trio.fail_after(30):
        async with running_server(tiny_model, api_key=KEY, cors_origins=["*"]) as server:
            async with connected(server.port) as client:
                stream = await client.request("POST", "/v1/chat/completions", body, _from(PAGE) + AUTH + JSON)
    assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
    _assert_allowed(stream)
    payloads = stream.sse_payloads()
    assert payloads[-1] == "[DONE]" and len(payloads) > 2


async def test_an_error_event_inside_a_stream_reaches_an_allowed_page(tiny_model: Model) -> None:
    # A stream the server ends itself (here: shutdown) still went out with the CORS head.
    body = json.dumps({**CHAT, "stream": True, "max_tokens": 400}).encode()
    with trio.fail_after(30):
        async with running_server(tiny_model, cors_origins=[PAGE], grace=0.0) as server:
            async with connected(server.port) as client:
                await client.send_request("POST", "/v1/chat/completions", body, _from(PAGE) + JSON)
                head = await client.read_head()
                server.shutdown()
                rest = await client.read_body()
    headers = {name.decode(): value.decode() for name, value in head.headers}
    assert headers["access-control-allow-origin"] == PAGE
    assert b'"error"' in rest and rest.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize(("name", "request_bytes", "status"), [
    ("body too large (Content-Length)", b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: " + PAGE.encode()
     + b"\r\nContent-Type: application/json\r\nContent-Length: 999999\r\n\r\n", 413),
    ("head too large", b"GET /health HTTP/1.1\r\nHost: localhost\r\nOrigin: " + PAGE.encode() + b"\r\nX-Pad: "
     + b"a" * 3000 + b"\r\n\r\n", 431),
    ("body too slow", b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: " + PAGE.encode()
     + b"\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{", 408),
])
async def test_the_http_layers_own_refusals_carry_the_headers_too(tiny_model: Model, name, request_bytes,
                                                                  status) -> None:
    limits = HttpLimits(max_body_bytes=1000, max_header_bytes=2048, body_timeout=0.3, linger_timeout=0.1)
    with trio.fail_after(20):
        async with running_server(tiny_model, http_limits=limits, cors_origins=[PAGE]) as server:
            raw = await _raw_exchange(server.port, request_bytes)
    got, headers = _head_lines(raw)
    assert got == status, raw[:300]
    assert headers["access-control-allow-origin"] == PAGE
    assert "Origin" in headers["vary"]


async def test_a_disallowed_origin_gets_no_cors_headers_and_its_preflight_is_refused(tiny_model: Model) -> None:
    evil = "http://evil.test"
    with trio.fail_after(20):
        async with running_server(tiny_model, api_key=KEY, cors_origins=[PAGE]) as server:
            preflight = await fetch(server.port, "OPTIONS", "/v1/chat/completions", headers=_preflight_headers(evil))
            models = await fetch(server.port, "GET", "/v1/models", headers=_from(evil) + AUTH)
            missing_key = await fetch(server.port, "GET", "/v1/models", headers=_from(evil))
            no_origin = await fetch(server.port, "GET", "/v1/models", headers=AUTH)
            assert server.engine.metrics.accepted.value() == 0
    error = assert_envelope(preflight, 403)
    assert evil in error["message"] and "--cors-origin" in error["message"]
    assert models.status == 200 and missing_key.status == 401 and no_origin.status == 200
    for answer in (preflight, models, missing_key, no_origin):
        assert _cors_headers(answer) == {}
        assert answer.headers.get("vary") == "Origin"  # the answer depends on Origin: caches must know


async def test_without_cors_origins_no_page_elsewhere_may_call(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            preflight = await fetch(server.port, "OPTIONS", "/v1/chat/completions", headers=_preflight_headers())
            models = await fetch(server.port, "GET", "/v1/models", headers=_from(PAGE))
    assert_envelope(preflight, 403)
    assert _cors_headers(preflight) == {} and _cors_headers(models) == {}
    assert "vary" not in models.headers


async def test_a_plain_options_request_is_not_a_preflight(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model, cors_origins=["*"]) as server:
            answer = await fetch(server.port, "OPTIONS", "/v1/models", headers=_from(PAGE))
    assert_envelope(answer, 405)  # routed as usual
    _assert_allowed(answer)


async def test_serve_refuses_something_that_is_not_an_origin(tiny_model: Model) -> None:
    with trio.fail_after(20):
        with pytest.RaisesGroup(pytest.RaisesExc(KestrelError, match="no path"), flatten_subgroups=True):
            async with trio.open_nursery() as nursery:
                await nursery.start(lambda task_status: serve(tiny_model, port=0, cors_origins=["http://a.test/x"],
                                                              task_status=task_status))
