"""Request/response round trips over real sockets: framing, keep-alive, errors."""

from __future__ import annotations

import pytest
import trio

from http_kit import RawClient, assert_envelope, build_request, start_server
from kestrel_trio.http import HttpLimits

pytestmark = pytest.mark.usefixtures("close_raw_clients")
BUDGET = 10  # s, absolute per test


async def test_get_and_post_round_trip(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        got = await client.request("GET", "/hello?x=1&y=2")
        assert got.status == 200
        assert got.json() == {"hello": "world", "query": "x=1&y=2"}
        assert got.headers["content-type"] == "application/json"
        assert got.headers["server"] == "kestrel-trio"
        assert got.headers["content-length"] == str(len(got.body))

        posted = await client.request("POST", "/echo", b'{"a": 1}')
        assert posted.status == 200
        assert posted.json()["body"] == '{"a": 1}'
        assert posted.json()["client"].startswith("127.0.0.1:")
        assert posted.headers["x-echo-length"] == "8"


async def test_keep_alive_serves_several_requests_on_one_connection(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        for index in range(5):
            body = f"request {index}".encode()
            got = await client.request("POST", "/echo", body)
            assert got.json()["body"] == body.decode()
        assert running.server.connections == 1


async def test_immediate_answers_are_served_on_keep_alive_and_their_errors_get_envelopes(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        for index in range(3):
            got = await client.request("GET", f"/now?{index}")
            assert got.status == 200 and got.json() == {"now": str(index)}
        refused = await client.request("GET", "/now-refuses")
        assert assert_envelope(refused, 400)["param"] == "now"
        assert (await client.request("GET", "/now?again")).json() == {"now": "again"}
        assert running.server.connections == 1


async def test_pipelined_requests_are_answered_in_order(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        bodies = [f"pipelined-{index}".encode() * (index + 1) for index in range(4)]
        await client.send(b"".join(build_request("POST", "/echo", body) for body in bodies))
        for body in bodies:
            got = await client.read_response()
            assert got.status == 200
            assert got.json()["body"] == body.decode()


async def test_pipelined_request_behind_a_slow_stream_is_kept_not_a_disconnect(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(build_request("GET", "/finite") + build_request("POST", "/echo", b"next"))
        streamed = await client.read_response()
        assert streamed.body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        follow_up = await client.read_response()
        assert follow_up.json()["body"] == "next"


async def test_chunked_request_body_is_reassembled(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        chunked = b"5\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\n\r\n"
        await client.send(build_request("POST", "/echo", chunked, (("Transfer-Encoding", "chunked"),)))
        got = await client.read_response()
        assert got.json()["body"] == "hello world"


@pytest.mark.parametrize("order", ["cl_first", "te_first"])
async def test_content_length_with_transfer_encoding_is_refused_and_closed(nursery, order):
    # RFC 9112 6.1: a smuggling shape (a proxy may frame it by the other header); the pipelined request after it
    # must never be served on this connection.
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        framing = (("Content-Length", "4"), ("Transfer-Encoding", "chunked"))
        chunked = b"5\r\nhello\r\n0\r\n\r\n"
        smuggled = build_request("GET", "/hello")
        await client.send(build_request("POST", "/echo", chunked, framing[::1 if order == "cl_first" else -1])
                          + smuggled)
        got = await client.read_response()
        error = assert_envelope(got, 400, "malformed_request")
        assert "Content-Length" in error["message"] and "Transfer-Encoding" in error["message"]
        assert got.headers["connection"] == "close"
        assert await client.read_until_closed() == b""


async def test_expect_100_continue_gets_100_before_the_body_is_sent(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        head = build_request("POST", "/echo", b"", (("Content-Length", "4"), ("Expect", "100-continue")))
        await client.send(head)
        interim = await client.read_response(method="POST", stop_at_informational=True)
        assert interim.status == 100
        await client.send(b"ping")
        got = await client.read_response(method="POST")
        assert got.json()["body"] == "ping"


async def test_expect_100_continue_with_oversize_length_gets_413_without_100(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, HttpLimits(max_body_bytes=100))
        client = await RawClient.connect(running.port)
        head = build_request("POST", "/echo", b"", (("Content-Length", "101"), ("Expect", "100-continue")))
        await client.send(head)
        got = await client.read_response(method="POST", stop_at_informational=True)
        assert_envelope(got, 413, "body_too_large")
        assert got.headers["connection"] == "close"


async def test_unknown_path_is_404_envelope(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        got = await client.request("GET", "/v1/nothing")
        error = assert_envelope(got, 404, "unknown_url")
        assert error["type"] == "invalid_request_error"
        assert "/v1/nothing" in error["message"]


async def test_wrong_method_is_405_with_allow(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        got = await client.request("DELETE", "/echo")
        assert_envelope(got, 405, "method_not_allowed")
        assert got.headers["allow"] == "POST"
        wrong = await client.request("DELETE", "/hello")
        assert_envelope(wrong, 405, "method_not_allowed")
        assert wrong.headers["allow"] == "GET, HEAD"
        head = await client.request("HEAD", "/echo")
        assert head.status == 405 and head.body == b"" and head.headers["allow"] == "POST"
        # the connection survives handler-level errors
        assert (await client.request("GET", "/hello")).status == 200


async def test_head_is_served_wherever_get_is_with_the_get_head_and_no_body(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        for path in ("/hello", "/now", "/finite", "/kestrel"):
            got = await client.request("GET", path)
            head = await client.request("HEAD", path)
            assert head.status == got.status and head.body == b""
            assert {k: v for k, v in head.headers.items() if k != "date"} == {
                k: v for k, v in got.headers.items() if k != "date"}
        # The Content-Length of a HEAD answer is the GET body's; the connection stayed in step throughout.
        assert head.headers["content-length"] == str(len(got.body))
        assert running.app.stream.chunks_made == 3  # /finite's HEAD made no chunk: only its GET ran
        assert (await client.request("GET", "/hello")).status == 200


async def test_kestrel_error_keeps_its_status_and_envelope(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        got = await client.request("GET", "/kestrel")
        error = assert_envelope(got, 400)
        assert error == {
            "message": "temperature must be at most 2",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": None,
        }
        assert "retry-after" not in got.headers


async def test_kestrel_error_with_retry_after_sets_header_rounded_up(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        got = await client.request("GET", "/queue-full")
        error = assert_envelope(got, 429, "queue_full")
        assert error["type"] == "rate_limit_error"
        assert got.headers["retry-after"] == "2"


async def test_unexpected_exception_is_generic_500_without_details(nursery, caplog):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        got = await client.request("GET", "/boom")
        error = assert_envelope(got, 500)
        assert error["type"] == "server_error"
        assert b"secret-internal-detail" not in got.body
        assert b"Traceback" not in got.body and b"RuntimeError" not in got.body
        assert (await client.request("GET", "/hello")).status == 200
    logged = [record for record in caplog.records if record.exc_info]
    assert any("secret-internal-detail" in str(record.exc_info[1]) for record in logged)


async def test_malformed_request_line_is_400_then_close(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(b"THIS IS NOT HTTP\r\n\r\n")
        got = await client.read_response()
        assert_envelope(got, 400, "malformed_request")
        assert got.headers["connection"] == "close"
        assert await client.read_until_closed() == b""


async def test_unsupported_http_version_is_505(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(b"GET /hello HTTP/2.0\r\nHost: test\r\n\r\n")
        assert_envelope(await client.read_response(), 505, "http_version_not_supported")
        assert await client.read_until_closed() == b""


async def test_http_1_0_request_is_answered_and_closed(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(b"GET /finite HTTP/1.0\r\n\r\n")
        raw = await client.read_until_closed()
        assert raw.startswith(b"HTTP/1.1 200 ")
        assert raw.endswith(b"data: 0\n\ndata: 1\n\ndata: 2\n\n")  # close-delimited, not chunked


async def test_oversize_header_is_431(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, HttpLimits(max_header_bytes=1024))
        for size in (2000, 100_000):  # arrives complete in one read / exceeds h11's buffer limit
            client = await RawClient.connect(running.port)
            await client.send(build_request("GET", "/hello", b"", (("X-Big", "a" * size),)))
            got = await client.read_response()
            assert_envelope(got, 431)
            assert got.headers["connection"] == "close"
            await client.aclose()


async def test_oversize_content_length_is_413_before_the_body(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, HttpLimits(max_body_bytes=1000))
        client = await RawClient.connect(running.port)
        await client.send(build_request("POST", "/echo", b"", (("Content-Length", "1001"),)))
        got = await client.read_response(method="POST")
        assert_envelope(got, 413, "body_too_large")
        assert got.headers["connection"] == "close"


async def test_oversize_chunked_body_is_413(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, HttpLimits(max_body_bytes=1000))
        client = await RawClient.connect(running.port)
        chunk = b"200\r\n" + b"x" * 0x200 + b"\r\n"
        await client.send(build_request("POST", "/echo", b"", (("Transfer-Encoding", "chunked"),)) + chunk * 2)
        got = await client.read_response(method="POST")
        assert_envelope(got, 413, "body_too_large")
        # exactly at the limit is still fine
        client = await RawClient.connect(running.port)
        at_limit = b"3e8\r\n" + b"y" * 1000 + b"\r\n0\r\n\r\n"
        await client.send(build_request("POST", "/echo", b"", (("Transfer-Encoding", "chunked"),)) + at_limit)
        assert (await client.read_response()).json()["body"] == "y" * 1000


async def test_streaming_response_is_chunked_and_uncached(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(build_request("GET", "/finite"))
        got = await client.read_response()
        assert got.status == 200
        assert got.headers["transfer-encoding"] == "chunked"
        assert got.headers["cache-control"] == "no-cache"
        assert got.headers["content-type"] == "text/event-stream"
        assert "content-length" not in got.headers
        assert got.body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        await running.app.stream.closed.wait()
        # the connection is kept alive after a complete stream
        assert (await client.request("GET", "/hello")).status == 200


async def test_streamed_chunks_are_flushed_one_by_one(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(build_request("GET", "/stream"))
        received = b""
        while b"data: 2\n\n" not in received:
            received += await client.read_some()
        # the generator is at most one chunk ahead of what the client has seen
        assert running.app.stream.chunks_made <= 4


async def test_error_escaping_a_stream_is_logged_and_cuts_the_connection(nursery, caplog):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(build_request("GET", "/stream-fails"))
        raw = await client.read_until_closed()
        assert raw.startswith(b"HTTP/1.1 200 ") and b"data: first" in raw
        assert not raw.endswith(b"0\r\n\r\n")  # no terminating chunk: the client sees a truncated body
        await running.app.stream.closed.wait()
        fresh = await RawClient.connect(running.port)
        assert (await fresh.request("GET", "/hello")).status == 200
    assert any("escaped from a stream" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


async def test_unsendable_handler_results_become_500(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        for path in ("/bad-header", "/not-a-response"):
            got = await client.request("GET", path)
            assert_envelope(got, 500)
            assert "x-injected" not in got.headers and "set-cookie" not in got.headers


async def test_unsupported_transfer_coding_is_refused(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery)
        client = await RawClient.connect(running.port)
        await client.send(build_request("POST", "/echo", b"", (("Transfer-Encoding", "gzip"),)))
        got = await client.read_response(method="POST")
        assert_envelope(got, 501)
        assert got.headers["connection"] == "close"
