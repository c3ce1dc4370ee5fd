"""Sans-IO parts of the HTTP layer: values, wire conversions, error translation, routing."""

from __future__ import annotations

import json
import logging

import h11
import pytest
import trio

from kestrel_trio.errors import BadRequestError, EngineUnavailableError, KestrelError, QueueFullError
from kestrel_trio.http import Request, Response, Router, error_response
from kestrel_trio.http.protocol.wire import declared_length, head_size, response_head, to_request
from kestrel_trio.http.responses import response_for_exception


def make_request(method: str = "GET", path: str = "/x", headers=()) -> Request:
    return Request(method=method, path=path, query="", headers=headers, body=b"", client="127.0.0.1:1")


def test_request_header_lookup_is_case_insensitive_and_first_wins():
    request = make_request(headers=(("x-a", "1"), ("content-type", "text/plain"), ("x-a", "2")))
    assert request.header("X-A") == "1"
    assert request.header("Content-Type") == "text/plain"
    assert request.header("missing") is None


def test_to_request_splits_query_and_lowers_header_names():
    event = h11.Request(method="POST", target="/v1/chat?stream=1&x=%20", headers=[("Host", "h"), ("X-Thing", b"\xe9")])
    request = to_request(event, b"body", "10.0.0.1:5")
    assert (request.method, request.path, request.query) == ("POST", "/v1/chat", "stream=1&x=%20")
    assert request.headers == (("host", "h"), ("x-thing", "\xe9"))
    assert (request.body, request.client) == (b"body", "10.0.0.1:5")


@pytest.mark.parametrize(
    ("target", "path", "query"),
    [("/", "/", ""), ("/a?", "/a", ""), ("http://host:1/v1/models?q", "/v1/models", "q"), ("http://host", "/", "")],
)
def test_to_request_handles_origin_and_absolute_form(target, path, query):
    request = to_request(h11.Request(method="GET", target=target, headers=[("host", "h")]), b"", "c")
    assert (request.path, request.query) == (path, query)


def test_declared_length_and_head_size():
    event = h11.Request(method="GET", target="/abc", headers=[("host", "h"), ("content-length", "12")])
    assert declared_length(event) == 12
    assert declared_length(h11.Request(method="GET", target="/", headers=[("host", "h")])) is None
    wire = b"GET /abc HTTP/1.1\r\nhost: h\r\ncontent-length: 12\r\n\r\n"
    assert head_size(event) == len(wire)


def test_response_head_owns_framing_and_server_headers():
    head = response_head(
        201,
        (("Content-Length", "999"), ("Transfer-Encoding", "gzip"), ("Server", "other"), ("X-Id", "7")),
        "application/json",
        (("content-length", "2"),),
    )
    assert head.status_code == 201 and head.reason == b"Created"
    assert list(head.headers) == [
        (b"server", b"kestrel-trio"),
        (b"x-id", b"7"),
        (b"content-type", b"application/json"),
        (b"content-length", b"2"),
    ]


def test_response_head_keeps_an_explicit_content_type_and_refuses_bad_values():
    head = response_head(200, (("Content-Type", "text/plain"),), "application/json", ())
    assert [value for name, value in head.headers if name == b"content-type"] == [b"text/plain"]
    with pytest.raises(h11.LocalProtocolError):
        response_head(200, (("X-Bad", "a\r\nb"),), "text/plain", ())
    assert response_head(499, (), "text/plain", ()).reason == b""


def envelope(response: Response) -> dict:
    return json.loads(response.body)["error"]


def test_error_response_is_an_openai_envelope():
    response = error_response(404, "nope", code="unknown_url")
    assert response.content_type == "application/json"
    expected = {"message": "nope", "type": "invalid_request_error", "param": None, "code": "unknown_url"}
    assert envelope(response) == expected
    assert envelope(error_response(503, "busy"))["type"] == "server_error"


def test_kestrel_errors_keep_status_type_param_and_code():
    response = response_for_exception(BadRequestError("bad n", param="n"))
    assert response.status == 400 and response.headers == ()
    assert envelope(response) == {"message": "bad n", "type": "invalid_request_error", "param": "n", "code": None}

    class Conflict(KestrelError):
        status = 409

    assert response_for_exception(Conflict("taken")).status == 409


@pytest.mark.parametrize(("retry_after", "header"), [(1.2, "2"), (3.0, "3"), (0.01, "1"), (0, "0")])
def test_retry_after_is_rounded_up_to_whole_seconds(retry_after, header):
    response = response_for_exception(QueueFullError("full", retry_after=retry_after))
    assert response.status == 429
    assert response.headers == (("retry-after", header),)


def test_retry_after_none_sends_no_header():
    assert response_for_exception(EngineUnavailableError("loading")).headers == ()


def test_other_exceptions_are_logged_and_hidden(caplog):
    with caplog.at_level(logging.ERROR, logger="kestrel_trio.http"):
        response = response_for_exception(KeyError("secret-key-name"))
    assert response.status == 500
    assert b"secret-key-name" not in response.body and b"KeyError" not in response.body
    assert envelope(response)["type"] == "server_error"
    assert caplog.records and caplog.records[0].exc_info[0] is KeyError


async def ok(request: Request) -> Response:
    return Response(200, request.method.encode())


async def test_router_dispatches_on_method_and_exact_path():
    router = Router()
    router.add("GET", "/v1/models", ok)
    router.add("post", "/v1/models", ok)
    assert (await router(make_request("GET", "/v1/models"))).body == b"GET"
    assert (await router(make_request("POST", "/v1/models"))).body == b"POST"
    missing = await router(make_request("GET", "/v1/models/"))
    assert missing.status == 404 and envelope(missing)["code"] == "unknown_url"
    wrong = await router(make_request("DELETE", "/v1/models"))
    assert wrong.status == 405 and dict(wrong.headers)["allow"] == "GET, HEAD, POST"
    assert (await router(make_request("HEAD", "/v1/models"))).body == b"HEAD"  # GET's handler serves HEAD


async def test_head_is_derived_from_get_only():
    router = Router()
    router.add("POST", "/post-only", ok)
    router.add_immediate("GET", "/now", lambda request: Response(200, b"now"))
    assert router.answer_now(make_request("HEAD", "/now")).body == b"now"  # the server drops the body
    refused = await router(make_request("HEAD", "/post-only"))
    assert refused.status == 405 and dict(refused.headers)["allow"] == "POST"
    with pytest.raises(ValueError, match="already registered"):
        router.add("HEAD", "/now", ok)


async def test_prefix_routes_match_longer_paths_and_exact_routes_win():
    router = Router()
    router.add("GET", "/v1/models", ok)
    router.add_immediate("GET", "/v1/models/", lambda request: Response(200, request.path.encode()), prefix=True)
    router.add("POST", "/v1/models/special", ok)
    assert router.answer_now(make_request("GET", "/v1/models/Qwen/Qwen3-0.6B")).body == b"/v1/models/Qwen/Qwen3-0.6B"
    assert router.answer_now(make_request("HEAD", "/v1/models/a%2Fb")).body == b"/v1/models/a%2Fb"
    assert (await router(make_request("GET", "/v1/models"))).body == b"GET"
    assert (await router(make_request("POST", "/v1/models/special"))).body == b"POST"
    missing = router.answer_now(make_request("GET", "/v1/models/"))  # the prefix alone names no model
    assert missing.status == 404 and envelope(missing)["code"] == "unknown_url"
    wrong = router.answer_now(make_request("DELETE", "/v1/models/x"))
    assert wrong.status == 405 and dict(wrong.headers)["allow"] == "GET, HEAD"


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON", "application/json; charset=utf-8",
                                          " application/json ;charset=UTF-8"])
async def test_a_json_route_accepts_json_whatever_its_case_and_parameters(content_type):
    router = Router()
    router.add("POST", "/json", ok, media_types=("application/json",))
    request = make_request("POST", "/json", headers=(("content-type", content_type),))
    assert router.answer_now(request) is None
    assert (await router(request)).body == b"POST"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx", "", "json"])
async def test_a_json_route_refuses_other_bodies_with_415_before_its_handler(content_type):
    ran = []

    async def handler(request: Request) -> Response:
        ran.append(request)
        return Response(200)

    router = Router()
    router.add("POST", "/json", handler, media_types=("application/json",))
    headers = () if content_type is None else (("content-type", content_type),)
    request = make_request("POST", "/json", headers=headers)
    for refusal in (router.answer_now(request), await router(request)):
        assert refusal.status == 415 and envelope(refusal)["code"] == "unsupported_media_type"
        assert "application/json" in envelope(refusal)["message"]
    assert ran == []


async def test_router_answers_immediate_routes_and_refusals_now_and_defers_the_rest():
    router = Router()
    router.add("POST", "/slow", ok)
    router.add_immediate("GET", "/health", lambda request: Response(200, b"fine"))
    assert router.answer_now(make_request("GET", "/health")).body == b"fine"
    assert (await router(make_request("GET", "/health"))).body == b"fine"  # the async entry serves it too
    assert router.answer_now(make_request("POST", "/slow")) is None
    assert router.answer_now(make_request("GET", "/nowhere")).status == 404
    wrong = router.answer_now(make_request("GET", "/slow"))
    assert wrong.status == 405 and dict(wrong.headers)["allow"] == "POST"
    with pytest.raises(ValueError, match="already registered"):
        router.add_immediate("GET", "/health", lambda request: Response(200))


def test_router_refuses_duplicate_routes():
    router = Router()
    router.add("GET", "/a", ok)
    with pytest.raises(ValueError, match="already registered"):
        router.add("get", "/a", ok)


async def test_kestrel_error_raised_from_a_handler_nursery_keeps_its_status():
    async def fail() -> None:
        raise BadRequestError("inner", param="p")

    with pytest.raises(Exception) as caught:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail)
    response = response_for_exception(caught.value)
    assert response.status == 400 and envelope(response)["param"] == "p"
