"""GET /v1/models/{id}, HEAD on every GET route, and JSON-only POST bodies, over real sockets."""

from __future__ import annotations

import json

import openai
import pytest
import trio

from kestrel_trio.model import Model

from server_kit import assert_envelope, client_for, connected, fetch, running_server

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
POST_ROUTES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"prompt": "Hi", "max_tokens": 2, "temperature": 0},
    "/tokenize": {"prompt": "Hi"},
    "/detokenize": {"tokens": [5, 6]},
}


async def test_the_official_client_retrieves_the_served_model_even_with_a_slash_in_its_id(tiny_model: Model) -> None:
    def retrieve(server, model_id):
        with client_for(server) as client:
            found = client.models.retrieve(model_id)
            with pytest.raises(openai.NotFoundError) as missing:
                client.models.retrieve("Qwen/not-served")
            return found, missing.value

    with trio.fail_after(30):
        async with running_server(tiny_model, model_id="Qwen/Qwen3-0.6B") as server:
            found, missing = await trio.to_thread.run_sync(retrieve, server, "Qwen/Qwen3-0.6B")
            listed = (await fetch(server.port, "GET", "/v1/models")).json()["data"][0]
            raw = await fetch(server.port, "GET", "/v1/models/Qwen/Qwen3-0.6B")  # an older client: "/" unencoded
            encoded = await fetch(server.port, "GET", "/v1/models/Qwen%2FQwen3-0.6B")
    assert (found.id, found.object, found.owned_by) == ("Qwen/Qwen3-0.6B", "model", "kestrel-trio")
    assert raw.status == encoded.status == 200
    assert raw.json() == encoded.json() == listed == found.model_dump(exclude_unset=True)
    assert missing.status_code == 404
    assert missing.body == {"message": "The model 'Qwen/not-served' does not exist; this server serves "
                            "'Qwen/Qwen3-0.6B'", "type": "invalid_request_error", "param": "model",
                            "code": "model_not_found"}


async def test_an_unknown_model_id_is_a_404_envelope_naming_the_model(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            missing = await fetch(server.port, "GET", "/v1/models/gpt-4o")
            bare = await fetch(server.port, "GET", "/v1/models/")
    error = assert_envelope(missing, 404)
    assert (error["param"], error["code"]) == ("model", "model_not_found") and "gpt-4o" in error["message"]
    assert assert_envelope(bare, 404)["code"] == "unknown_url"


@pytest.mark.parametrize("path", ["/health", "/metrics", "/v1/models", "/v1/models/{id}", "/v1/models/nope"])
async def test_head_answers_like_get_without_a_body(tiny_model: Model, path: str) -> None:
    path = path.format(id=tiny_model.name)
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            async with connected(server.port) as client:
                get = await client.request("GET", path)
                head = await client.request("HEAD", path)
                after = await client.request("GET", "/health")  # the connection is still in step
    assert head.status == get.status and head.body == b"" and after.status == 200
    assert head.headers.keys() == get.headers.keys()
    assert head.headers["content-type"] == get.headers["content-type"]
    if path == "/metrics":  # counters move between the two requests; the length is the GET body's of its moment
        assert int(head.headers["content-length"]) > 0
    else:
        assert head.headers == get.headers and head.headers["content-length"] == str(len(get.body))
    assert head.raw.endswith(b"\r\n\r\n")  # nothing after the head


async def test_405_lists_head_where_get_is_allowed(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            on_get = await fetch(server.port, "DELETE", "/health")
            on_model = await fetch(server.port, "POST", f"/v1/models/{tiny_model.name}")
            on_post = await fetch(server.port, "HEAD", "/v1/chat/completions")
    assert assert_envelope(on_get, 405)["code"] == "method_not_allowed"
    assert on_get.headers["allow"] == on_model.headers["allow"] == "GET, HEAD"
    assert on_post.status == 405 and on_post.body == b"" and on_post.headers["allow"] == "POST"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
@pytest.mark.parametrize("path", sorted(POST_ROUTES))
async def test_a_post_body_that_is_not_declared_json_is_refused_415_before_anything_runs(
    tiny_model: Model, path: str, content_type: str | None,
) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            response = await fetch(server.port, "POST", path, POST_ROUTES[path], content_type=content_type)
            steps, queued = server.engine.metrics.steps.value(), server.engine.metrics.accepted.value()
    error = assert_envelope(response, 415)
    assert (error["type"], error["code"]) == ("invalid_request_error", "unsupported_media_type")
    assert "application/json" in error["message"]
    assert steps == 0 and queued == 0


async def test_a_cross_site_simple_post_starts_no_generation(tiny_model: Model) -> None:
    # What a form or fetch(..., {mode: "no-cors"}) on another site sends: text/plain, no preflight.
    body = json.dumps({**CHAT, "max_tokens": 20, "ignore_eos": True}).encode()
    headers = (("origin", "https://evil.example"), ("content-type", "text/plain;charset=UTF-8"))
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            metrics = server.engine.metrics
            async with connected(server.port) as client:
                refused = await client.request("POST", "/v1/chat/completions", body, headers)
                after_refusal = (metrics.accepted.value(), metrics.steps.value())
                served = await client.request("POST", "/v1/chat/completions", body,
                                              (("content-type", "Application/JSON; charset=utf-8"),))
    assert_envelope(refused, 415)
    assert after_refusal == (0, 0)
    assert served.status == 200 and served.json()["usage"]["completion_tokens"] == 20  # the same body, declared JSON


async def test_expect_100_continue_with_a_wrong_content_type_is_refused_before_the_body(tiny_model: Model) -> None:
    body = json.dumps(CHAT).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode()
    with trio.fail_after(20):
        async with running_server(tiny_model) as server:
            async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
                await stream.send_all(head)
                refused = await stream.receive_some(65536)
    assert refused.startswith(b"HTTP/1.1 415 ") and b"100 Continue" not in refused
