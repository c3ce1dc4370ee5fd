"""The server over raw sockets: error envelopes, routing, keep-alive, /health, /metrics, API keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from kestrel_trio.model import Model

from server_kit import assert_envelope, connected, fetch, running_server

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}


async def test_malformed_json_gets_a_400_envelope(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            async with connected(server.port) as client:
                response = await client.request("POST", "/v1/chat/completions", b'{"messages": [')
    error = assert_envelope(response, 400)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_field_of_the_wrong_type_is_named_in_param(tiny_model: Model, path: str) -> None:
    fields = {"prompt": "Hi", "max_tokens": 3} if path == "/v1/completions" else CHAT
    body = {**fields, "temperature": "hot"}
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            response = await fetch(server.port, "POST", path, body)
            assert server.engine.metrics.steps.value() == 0
    error = assert_envelope(response, 400)
    assert error["param"] == "temperature"
    assert "temperature" in error["message"]


async def test_unknown_path_and_wrong_method(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            unknown = await fetch(server.port, "GET", "/v1/engines")
            wrong_method = await fetch(server.port, "GET", "/v1/chat/completions")
    assert_envelope(unknown, 404)
    assert_envelope(wrong_method, 405)
    assert "POST" in [method.strip() for method in wrong_method.headers["allow"].split(",")]


async def test_several_requests_on_one_keep_alive_connection(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            async with connected(server.port) as client:
                health = await client.request("GET", "/health")
                chat = await client.request("POST", "/v1/chat/completions", json.dumps(CHAT).encode())
                streamed = await client.request(
                    "POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 2, "stream": True}).encode()
                )
                refused = await client.request("POST", "/v1/completions", b"[]")
                models = await client.request("GET", "/v1/models")
    assert health.status == 200 and health.json()["status"] == "ok"
    assert chat.status == 200 and chat.json()["usage"]["completion_tokens"] == 3
    assert streamed.status == 200 and streamed.sse_payloads()[-1] == "[DONE]"
    assert_envelope(refused, 400)
    assert models.json()["data"][0]["id"] == tiny_model.name
    for response in (health, chat, streamed, refused, models):
        assert response.headers.get("connection", "").lower() != "close"


async def test_health_shape(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            response = await fetch(server.port, "GET", "/health")
    assert response.status == 200
    body = response.json()
    assert {"status", "model", "busy", "queued", "active"} <= set(body)
    assert (body["status"], body["model"]) == ("ok", tiny_model.name)
    assert (body["busy"], body["queued"], body["active"], body["batch"]) == (False, 0, 0, 0)


async def test_metrics_exposes_engine_gauges_and_counters(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            served = await fetch(server.port, "POST", "/v1/chat/completions", CHAT)
            response = await fetch(server.port, "GET", "/metrics")
    assert served.status == 200
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/plain")
    lines = response.body.decode().splitlines()
    assert "kestrel:num_requests_running 0.0" in lines
    assert "# TYPE kestrel:request_cancelled_total counter" in lines
    assert "kestrel:generation_tokens_total 3.0" in lines


KEY = "sk-test-7f3a"
FIXTURE_CHECKPOINT = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-key", f"Basic {KEY}", f"Bearer {KEY}x"])
async def test_api_key_refusals(tiny_model: Model, authorization: str | None) -> None:
    headers = () if authorization is None else (("authorization", authorization),)
    with trio.fail_after(20):
        async with running_server(tiny_model, api_key=KEY) as server:
            models = await fetch(server.port, "GET", "/v1/models", headers=headers)
            chat = await fetch(server.port, "POST", "/v1/chat/completions", CHAT, headers=headers)
            assert server.engine.metrics.steps.value() == 0
    for response in (models, chat):
        error = assert_envelope(response, 401)
        assert error["code"] == "invalid_api_key"
        assert KEY not in response.body.decode()


async def test_api_key_accepted_and_health_open(tiny_model: Model) -> None:
    auth = (("authorization", f"Bearer {KEY}"),)
    with trio.fail_after(20):
        async with running_server(tiny_model, api_key=KEY) as server:
            models = await fetch(server.port, "GET", "/v1/models", headers=auth)
            chat = await fetch(server.port, "POST", "/v1/chat/completions", CHAT, headers=auth)
            health = await fetch(server.port, "GET", "/health")
    assert models.status == 200 and models.json()["data"][0]["id"] == tiny_model.name
    assert chat.status == 200 and chat.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert health.status == 200 and health.json()["status"] == "ok"


async def test_open_paths_are_configurable(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_server(tiny_model, api_key="sesame", open_paths=("/health", "/v1/models")) as server:
            models = await fetch(server.port, "GET", "/v1/models")
            metrics = await fetch(server.port, "GET", "/metrics")
            health = await fetch(server.port, "GET", "/health")
    assert (models.status, metrics.status, health.status) == (200, 401, 200)


async def test_expect_100_continue_is_refused_before_the_body_without_the_api_key(tiny_model: Model) -> None:
    body = json.dumps(CHAT).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n").encode()
    with trio.fail_after(20):
        async with running_server(tiny_model, api_key=KEY) as server:
            async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
                await stream.send_all(head + b"\r\n")
                refused = await stream.receive_some(65536)
            async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
                await stream.send_all(head + f"Authorization: Bearer {KEY}\r\n\r\n".encode())
                interim = await stream.receive_some(65536)
    assert refused.startswith(b"HTTP/1.1 401 ") and b"100 Continue" not in refused
    assert b"connection: close" in refused.lower()
    assert interim.startswith(b"HTTP/1.1 100 ")


async def test_health_reports_the_weight_residency_chosen_at_load() -> None:
    with trio.fail_after(60):
        async with running_server(FIXTURE_CHECKPOINT, weights="bf16") as server:
            mapped = (await fetch(server.port, "GET", "/health")).json()
            completion = await fetch(server.port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        async with running_server(FIXTURE_CHECKPOINT, weights="fp32") as server:
            copied = (await fetch(server.port, "GET", "/health")).json()
    assert (mapped["weights"], copied["weights"]) == ("bf16", "fp32")
    assert completion.status == 200 and completion.json()["usage"]["completion_tokens"] == 2


async def test_health_reports_quantized_residencies(tmp_path) -> None:
    gguf_file = FIXTURE_CHECKPOINT.parent / "gguf" / "qwen3_quant" / "qwen3_quant.gguf"
    with trio.fail_after(60):
        async with running_server(gguf_file) as server:  # auto keeps a GGUF as stored
            stored = (await fetch(server.port, "GET", "/health")).json()
            completion = await fetch(server.port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        async with running_server(FIXTURE_CHECKPOINT, weights="int4", quantized_cache=tmp_path) as server:
            quantized = (await fetch(server.port, "GET", "/health")).json()
    assert (stored["weights"], quantized["weights"]) == ("gguf", "int4")
    assert completion.status == 200 and completion.json()["usage"]["completion_tokens"] == 2
    assert len(list(tmp_path.glob("*.kq"))) == 1  # the cache folder serve() was given


async def test_metrics_count_connections_and_the_requests_the_http_layer_refused(tiny_model: Model) -> None:
    with trio.fail_after(30):
        async with running_server(tiny_model) as server:
            async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
                await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
                refused = await stream.receive_some(65536)
            text = (await fetch(server.port, "GET", "/metrics")).body.decode()
    assert refused.startswith(b"HTTP/1.1 400 ")
    assert 'kestrel:http_requests_refused_total{code="malformed_request"} 1' in text
    assert "kestrel:http_connections_total 2" in text  # the malformed one and this /metrics request
    assert "kestrel:http_connections_open 1" in text
    assert "kestrel:num_requests_running 0" in text  # the engine's metrics are still there
