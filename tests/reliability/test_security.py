"""Security: loopback by default, the API key (required, constant-time, never
echoed or logged), limits enforced before any compute, no file access through
any request field, and error bodies without tracebacks or internals.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
from pathlib import Path

import pytest
import trio
from rel_kit import (
    assert_envelope,
    chat_json,
    completion_json,
    connected,
    fetch,
    running_server,
)

import kestrel_trio.engine.engine as engine_module
from kestrel_trio.app import routes
from kestrel_trio.cli.parser import build_parser
from kestrel_trio.http import HttpLimits, serve_http
from kestrel_trio.model import Model
from kestrel_trio.server import serve

KEY = "sk-kestrel-7f3a9c1e5b2d4f60"
AUTH = (("authorization", f"Bearer {KEY}"),)
GUARDED = [  # (method, path, body): every route but /health and /metrics, plus paths that do not exist
    ("GET", "/v1/models", None),
    ("POST", "/v1/chat/completions", chat_json(2, stream=False)),
    ("POST", "/v1/completions", completion_json(2, stream=False)),
    ("POST", "/tokenize", {"prompt": "hi"}),
    ("POST", "/detokenize", {"tokens": [5, 6]}),
    ("GET", "/v1/chat/completions", None),
    ("GET", "/v1/no-such-route", None),
]
WRONG_AUTHORIZATIONS = [None, "Bearer", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", f"Basic {KEY}", KEY,
                        f"Bearer {KEY.upper()}", "Bearer " + "x" * 10_000]


def test_everything_binds_loopback_by_default() -> None:
    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    assert inspect.signature(serve_http).parameters["host"].default == "127.0.0.1"
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"


async def test_a_server_started_without_a_host_listens_on_loopback_only(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(lambda task_status: serve(tiny_model, port=0, task_status=task_status))
            addresses = [listener.socket.getsockname()[0] for listener in server.http._listeners]
            nursery.cancel_scope.cancel()
    assert addresses == ["127.0.0.1"]


async def test_every_route_but_health_and_metrics_needs_the_key(tiny_model: Model) -> None:
    refused = []
    with trio.fail_after(30):
        async with running_server(tiny_model, api_key=KEY) as server:
            for method, path, body in GUARDED:
                for authorization in WRONG_AUTHORIZATIONS:
                    headers = () if authorization is None else (("authorization", authorization),)
                    refused.append(((method, path, authorization), await fetch(server.port, method, path, body,
                                                                               headers)))
            steps_while_refusing = server.engine.metrics.steps.value()
            open_routes = [await fetch(server.port, "GET", path) for path in ("/health", "/metrics")]
            allowed = [await fetch(server.port, method, path, body, AUTH) for method, path, body in GUARDED]

    for case, response in refused:
        error = assert_envelope(response, 401)
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key"), case
    assert steps_while_refusing == 0
    assert [response.status for response in open_routes] == [200, 200]
    assert [response.status for response in allowed] == [200, 200, 200, 200, 200, 405, 404]


async def test_the_key_is_compared_in_constant_time(tiny_model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    compared = []
    real_compare = routes.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(routes.hmac, "compare_digest", spy)
    with trio.fail_after(20):
        async with running_server(tiny_model, api_key=KEY) as server:
            wrong = await fetch(server.port, "GET", "/v1/models", headers=(("authorization", "Bearer sk-nope"),))
            right = await fetch(server.port, "GET", "/v1/models", headers=AUTH)
    assert (wrong.status, right.status) == (401, 200)
    assert len(compared) == 2 and compared[-1] == (KEY.encode(), KEY.encode())


async def test_the_key_never_appears_in_logs_or_responses(tiny_model: Model, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    near_misses = [f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", f"Basic {KEY}", KEY]
    with trio.fail_after(30):
        async with running_server(tiny_model, api_key=KEY) as server:
            responses = [await fetch(server.port, "GET", "/v1/models", headers=(("authorization", value),))
                         for value in near_misses]
            responses.append(await fetch(server.port, "POST", "/v1/completions", completion_json(2, stream=True),
                                         AUTH))
            responses.append(await fetch(server.port, "POST", "/v1/completions", {"prompt": 5}, AUTH))
            responses.append(await fetch(server.port, "GET", "/v1/models?api_key=" + KEY))
    assert [r.status for r in responses] == [401, 401, 401, 401, 200, 400, 401]
    for response in responses:
        assert KEY not in response.body.decode("utf-8", "replace")
        assert KEY not in json.dumps(response.headers)
    logged = "\n".join(record.getMessage() + str(record.__dict__) for record in caplog.records)
    assert "rejected" in logged  # the refusals were logged...
    assert KEY not in logged  # ...without the key


async def test_a_malformed_header_line_does_not_echo_the_key(tiny_model: Model) -> None:
    """h11 puts the offending header line into its error; the 400 body must not carry it back."""
    with trio.fail_after(20):
        async with running_server(tiny_model, api_key=KEY) as server, connected(server.port) as client:
            await client.stream.send_all(
                b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " + KEY.encode() + b"\x00\r\n\r\n"
            )
            response = await client.read_response()
    assert_envelope(response, 400)
    assert KEY not in response.body.decode("utf-8", "replace")


async def test_limits_are_enforced_before_any_compute(tiny_model: Model) -> None:
    limits = HttpLimits(max_body_bytes=4096, max_header_bytes=2048)
    too_long_prompt = list(range(10, 10 + tiny_model.context_length))
    cases = [  # (path, body bytes, status, error param)
        ("/v1/completions", json.dumps({"prompt": "x" * 5000}).encode(), 413, None),
        ("/v1/completions", json.dumps(completion_json(10**6, stream=True)).encode(), 400, "max_tokens"),
        ("/v1/completions", json.dumps({"prompt": too_long_prompt, "max_tokens": 1}).encode(), 400, "prompt"),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "word " * 600}],
                                             "max_tokens": 1}).encode(), 400, "messages"),
        ("/v1/completions", json.dumps({**completion_json(2, stream=False), "n": 10**6}).encode(), 400, "n"),
    ]
    answers = []
    with trio.fail_after(30):
        async with running_server(tiny_model, http_limits=limits) as server:
            for path, body, _, _ in cases:
                async with connected(server.port) as client:
                    answers.append(await client.request("POST", path, body))
            async with connected(server.port) as client:  # a huge declared length is refused before the body
                await client.stream.send_all(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                                             b"Content-Length: 1000000000\r\n\r\n")
                huge = await client.read_response()
            async with connected(server.port) as client:
                await client.stream.send_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * 4000 + b"\r\n\r\n")
                big_head = await client.read_response()
            metrics = server.engine.metrics
            work = (metrics.steps.value(), metrics.prompt_tokens.value(), server.engine.queued, server.engine.active)

    for (path, _, status, param), response in zip(cases, answers):
        error = assert_envelope(response, status)
        if param is not None:
            assert error["param"] == param, (path, error)
    assert_envelope(huge, 413)
    assert big_head.status == 431
    assert work == (0, 0, 0, 0)


async def test_a_context_error_names_max_completion_tokens_when_that_was_sent(tiny_model: Model) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 10**6, "stream": True}
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            response = await fetch(server.port, "POST", "/v1/chat/completions", body)
            steps = server.engine.metrics.steps.value()
    error = assert_envelope(response, 400)
    assert error["code"] == "context_length_exceeded" and steps == 0
    assert error["param"] == "max_completion_tokens"  # the field the client sent, not its legacy alias


@pytest.fixture(scope="module")
def open_events():
    """Paths passed to open() anywhere in this process while ``recording`` is set (a sys audit hook)."""
    state = {"recording": False, "paths": []}

    def hook(event: str, args: tuple) -> None:
        if state["recording"] and event == "open" and isinstance(args[0], (str, bytes)):
            state["paths"].append(str(args[0]))

    sys.addaudithook(hook)  # cannot be removed; inert once recording stops
    yield state
    state["recording"] = False


async def test_no_request_field_makes_the_server_read_or_write_files(tiny_model: Model, tmp_path: Path,
                                                                      open_events) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("CANARY-3141592653")
    target = tmp_path / "written.txt"
    include = "{% include '" + str(canary) + "' %}"
    chat = chat_json(2, stream=False)
    attempts = [
        ("/v1/chat/completions", {**chat, "model": str(canary)}),
        ("/v1/chat/completions", {**chat, "model": "../../../../" + str(canary)}),
        ("/v1/chat/completions", {**chat, "chat_template": include}),
        ("/v1/chat/completions", {**chat, "chat_template_kwargs": {"enable_thinking": include, "path": str(canary)}}),
        ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": include}]}),
        ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": canary.as_uri()}}]}]}),
        ("/v1/chat/completions", {**chat, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"$ref": canary.as_uri()}}}]}),
        ("/v1/chat/completions", {**chat, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": canary.as_uri()}}}}),
        ("/v1/completions", {**completion_json(2, stream=False), "prompt": canary.as_uri(), "echo": False}),
        ("/v1/completions", {**completion_json(2, stream=False), "suffix": str(target)}),
        ("/tokenize", {"prompt": str(canary), "model": str(canary)}),
        ("/tokenize", {"messages": [{"role": "user", "content": include}], "chat_template": include}),
    ]
    with trio.fail_after(30):
        async with running_server(tiny_model) as server:
            await fetch(server.port, "POST", "/v1/chat/completions", chat)  # warm-up: lazy imports open files
            open_events["recording"] = True
            try:
                responses = [await fetch(server.port, "POST", path, body) for path, body in attempts]
            finally:
                open_events["recording"] = False
            rendered = await fetch(server.port, "POST", "/tokenize",
                                   {"messages": [{"role": "user", "content": "{{ 7 * 7 }}"}]})
            text = (await fetch(server.port, "POST", "/detokenize", {"tokens": rendered.json()["tokens"]})).json()

    assert all(response.status < 500 for response in responses), [r.status for r in responses]
    assert not any(b"CANARY-3141592653" in response.body for response in responses)
    assert not [path for path in open_events["paths"] if str(tmp_path) in path or "/etc/" in path]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["canary.txt"]
    assert "{{ 7 * 7 }}" in text["prompt"]  # message content is data, never template code


async def test_failures_reach_the_client_without_traceback_or_internals(
    tiny_model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    detail = "internal detail at /srv/secret/module.py line 42"

    def broken_encode(text: str, **_) -> list[int]:
        raise RuntimeError(detail)

    def broken_step(decoder, generations, *_):
        raise RuntimeError(detail)

    with trio.fail_after(20):
        async with running_server(tiny_model, api_key=KEY) as server:
            monkeypatch.setattr(tiny_model, "encode_prompt", broken_encode)
            handler_failure = await fetch(server.port, "POST", "/v1/completions", completion_json(2, stream=False),
                                          AUTH)
            monkeypatch.undo()
            monkeypatch.setattr(engine_module, "step_generations", broken_step)
            step_failure = await fetch(server.port, "POST", "/v1/completions", completion_json(2, stream=False), AUTH)
            stream_failure = await fetch(server.port, "POST", "/v1/chat/completions", chat_json(2, stream=True), AUTH)

    assert_envelope(handler_failure, 500)
    assert_envelope(step_failure, 500)
    assert stream_failure.status == 200 and stream_failure.sse_payloads()[-1] == "[DONE]"
    assert "error" in json.loads(stream_failure.sse_payloads()[-2])
    for response in (handler_failure, step_failure, stream_failure):
        text = response.body.decode()
        assert "Traceback" not in text and "secret" not in text and "RuntimeError" not in text
        assert KEY not in text
