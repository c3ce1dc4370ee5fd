"""SSE framing: one data line per event, [DONE], error events, and the strict parser."""

from __future__ import annotations

import json

import pytest

from kestrel_trio.errors import BadRequestError, ContextLengthError
from kestrel_trio.openai import SSE_DONE, SSEFormatError, parse_sse, sse_error, sse_event

TRICKY = ["line1\nline2", "cr\rlf\r\n", "ls\u2028ps\u2029", "nel\x85", "😀 emoji", "中文字符", "data: [DONE]\n\n", ""]


@pytest.mark.parametrize("text", TRICKY)
def test_event_is_a_single_data_line(text):
    obj = {"choices": [{"delta": {"content": text}}]}
    event = sse_event(obj)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    line = event[len(b"data: "):-2]
    assert b"\n" not in line and b"\r" not in line
    assert len(line.decode("utf-8").splitlines()) == 1
    assert json.loads(line) == obj
    assert [json.loads(p) for p in parse_sse(event)] == [obj]


def test_stream_round_trip():
    objs = [{"i": i, "text": text} for i, text in enumerate(TRICKY)]
    stream = b"".join(sse_event(o) for o in objs) + SSE_DONE
    payloads = parse_sse(stream)
    assert payloads[-1] == "[DONE]"
    assert [json.loads(p) for p in payloads[:-1]] == objs


def test_done_marker():
    assert SSE_DONE == b"data: [DONE]\n\n"
    assert parse_sse(SSE_DONE) == ["[DONE]"]


def test_error_events():
    exc = ContextLengthError("prompt too long")
    assert json.loads(parse_sse(sse_error(exc))[0]) == {
        "error": {"message": "prompt too long", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}
    }
    bad = BadRequestError("bad\nthing", param="temperature")
    assert json.loads(parse_sse(sse_error(bad))[0])["error"]["param"] == "temperature"
    assert json.loads(parse_sse(sse_error("engine died"))[0]) == {
        "error": {"message": "engine died", "type": "server_error", "param": None, "code": None}
    }
    custom = json.loads(parse_sse(sse_error("x", "rate_limit_error", code="queue_full"))[0])
    assert custom["error"]["type"] == "rate_limit_error" and custom["error"]["code"] == "queue_full"


def test_empty_stream_has_no_events():
    assert parse_sse(b"") == []


@pytest.mark.parametrize(
    "data",
    [
        b"data: {}",                      # truncated: no blank line
        b"data: {}\n",                    # truncated: one newline
        b"data: {}\n\n\n",                # stray newline
        b"data: {}\r\n\r\n",              # CRLF framing is not ours
        b": keep-alive\n\n",              # comment
        b"event: x\ndata: {}\n\n",        # other fields
        b"data: a\ndata: b\n\n",          # multi-line event
        b"data:{}\n\n",                   # no space after the colon
        b"data: {}\n\n\n\ndata: {}\n\n",  # empty event
        b"data: \xff\n\n",                # not UTF-8
    ],
)
def test_parser_rejects_malformed_streams(data):
    with pytest.raises(SSEFormatError):
        parse_sse(data)
