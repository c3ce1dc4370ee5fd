"""The sans-IO CORS policy: origin matching, preflight answers, the headers added to responses."""

from __future__ import annotations

import json

import pytest

from kestrel_trio.http import CorsPolicy, Request
from kestrel_trio.http.policy.cors import normalize_origin
from kestrel_trio.http.protocol.wire import response_head

PAGE = "http://127.0.0.1:3000"


def _request(method: str = "GET", *headers: tuple[str, str]) -> Request:
    return Request(method=method, path="/v1/chat/completions", query="", headers=tuple(headers), body=b"",
                   client="127.0.0.1:1")


def _preflight(origin: str = PAGE, requested_headers: str | None = "authorization, content-type") -> Request:
    headers = [("origin", origin), ("access-control-request-method", "POST")]
    if requested_headers is not None:
        headers.append(("access-control-request-headers", requested_headers))
    return _request("OPTIONS", *headers)


@pytest.mark.parametrize(("text", "origin"), [
    ("http://127.0.0.1:3000", "http://127.0.0.1:3000"),
    ("HTTP://Example.COM", "http://example.com"),
    ("http://example.com:80", "http://example.com"),
    ("https://example.com:443/", "https://example.com"),
    ("https://example.com:8443", "https://example.com:8443"),
    ("http://[::1]:8080", "http://[::1]:8080"),
    ("*", "*"),
    ("null", "null"),
    ("  http://a.test  ", "http://a.test"),
])
def test_origins_are_normalized_as_browsers_send_them(text, origin):
    assert normalize_origin(text) == origin


@pytest.mark.parametrize(("text", "complaint"), [
    ("example.com", "scheme://host"),
    ("http://", "scheme://host"),
    ("http://a.test/chat", "no path"),
    ("http://a.test?x=1", "no path, query"),
    ("http://a.test#top", "fragment"),
    ("http://user@a.test", "user name"),
    ("http://a.test:99999", "not an origin"),
    ("", "scheme://host"),
])
def test_what_is_not_an_origin_is_refused_by_name(text, complaint):
    with pytest.raises(ValueError, match=complaint):
        normalize_origin(text)
    with pytest.raises(ValueError):
        CorsPolicy([text])


def test_one_string_is_not_a_list_of_origins():
    with pytest.raises(TypeError):
        CorsPolicy(PAGE)


def test_an_allowed_origin_matches_after_normalization_and_others_do_not():
    policy = CorsPolicy(["HTTP://127.0.0.1:3000/", "https://b.test"])
    assert policy.origins == {PAGE, "https://b.test"}
    assert policy.allows(PAGE)
    assert policy.allows("https://B.test:443")
    assert not policy.allows("http://127.0.0.1:3001")
    assert not policy.allows("https://127.0.0.1:3000")
    assert not policy.allows("null")
    assert not policy.allows("not an origin")
    assert not policy.allows(None)


def test_a_star_allows_every_origin_including_null():
    policy = CorsPolicy(["*"])
    assert policy.allows(PAGE) and policy.allows("null") and policy.allows("chrome-extension://abc")
    assert not policy.allows(None)


def test_no_origins_allow_nothing_and_add_no_headers():
    policy = CorsPolicy()
    assert not policy.allows(PAGE)
    assert policy.response_headers(PAGE) == ()
    assert policy.response_headers(None) == ()


def test_an_allowed_origin_is_echoed_with_vary():
    headers = dict(CorsPolicy(["*"]).response_headers(PAGE))
    assert headers["access-control-allow-origin"] == PAGE  # echoed, so the answer is exact for that origin
    assert headers["vary"] == "Origin"
    assert "Retry-After" in headers["access-control-expose-headers"]


def test_a_disallowed_or_missing_origin_gets_only_vary():
    policy = CorsPolicy([PAGE])
    assert policy.response_headers("http://evil.test") == (("vary", "Origin"),)
    assert policy.response_headers(None) == (("vary", "Origin"),)


def test_a_preflight_from_an_allowed_origin_is_204_with_methods_headers_and_max_age():
    policy = CorsPolicy([PAGE], max_age=123)
    answer = policy.preflight(_preflight())
    assert answer is not None and answer.status == 204 and answer.body == b""
    headers = dict(answer.headers)
    assert {"GET", "HEAD", "POST", "OPTIONS"} <= {m.strip() for m in headers["access-control-allow-methods"].split(",")}
    allowed = [h.strip().lower() for h in headers["access-control-allow-headers"].split(",")]
    assert "authorization" in allowed and "content-type" in allowed
    assert headers["access-control-max-age"] == "123"
    assert answer.content_type == ""  # a 204 has no body to describe
    # The allow-origin header itself is added where every response is written (response_headers).
    assert "access-control-allow-origin" not in headers


def test_a_preflight_allows_the_extra_headers_a_client_asks_for_once_each():
    answer = CorsPolicy([PAGE]).preflight(_preflight(requested_headers="X-Stainless-OS, authorization,, bad header,"))
    assert answer is not None
    allowed = [h.strip() for h in dict(answer.headers)["access-control-allow-headers"].split(",")]
    assert allowed == ["Authorization", "Content-Type", "x-stainless-os"]


def test_a_preflight_from_another_origin_is_refused_with_an_envelope_naming_it():
    answer = CorsPolicy([PAGE]).preflight(_preflight(origin="http://evil.test"))
    assert answer is not None and answer.status == 403
    error = json.loads(answer.body)["error"]
    assert "http://evil.test" in error["message"] and error["code"] == "cors_origin_not_allowed"
    assert not any(name.startswith("access-control-") for name, _ in answer.headers)


def test_an_empty_content_type_sends_no_content_type_header():
    head = response_head(204, (), "", ())
    assert not any(name == b"content-type" for name, _ in head.headers)


def test_only_options_with_origin_and_request_method_is_a_preflight():
    policy = CorsPolicy(["*"])
    assert policy.preflight(_request("OPTIONS")) is None
    assert policy.preflight(_request("OPTIONS", ("origin", PAGE))) is None
    assert policy.preflight(_request("POST", ("origin", PAGE), ("access-control-request-method", "POST"))) is None
    assert policy.preflight(_preflight()) is not None
