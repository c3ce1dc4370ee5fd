"""Chat choice items -> Anthropic events and message (sans-IO)."""

from __future__ import annotations

import itertools

from kestrel_trio import anthropic as an
from kestrel_trio.errors import QueueFullError
from qwen3_choice import qwen3_choice as ChatChoice  # the output read as a Qwen3 model's


def run(texts: list[str], finish_reason: str = "stop", stop_sequence: str | None = None, **choice) -> tuple:
    ids = (f"toolu_{i}" for i in itertools.count())
    chat = ChatChoice(0, make_id=lambda: next(ids), **choice)
    assembler = an.MessageAssembler("msg_1", "m", 5)
    events = assembler.start()
    for text in texts:
        events += assembler.push(chat.push(text))
    events += assembler.push(chat.finish(finish_reason))
    events += assembler.finish(chat.finish_reason, stop_sequence, len(texts))
    return events, assembler.message()


def test_text_then_a_tool_call() -> None:
    events, message = run(["Let me ", "check.", "<tool_call>\n", '{"name": "f", "arguments": {"a": 1}}',
                           "\n</tool_call>"], parse_tools=True)
    assert [name for name, _ in events] == [
        "message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop"]
    assert events[6][1]["content_block"] == {"type": "tool_use", "id": "toolu_0", "name": "f", "input": {}}
    assert events[7][1] == {"type": "content_block_delta", "index": 1,
                            "delta": {"type": "input_json_delta", "partial_json": '{"a": 1}'}}
    assert events[-2][1] == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                             "usage": {"output_tokens": 5}}
    assert message == {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                       "content": [{"type": "text", "text": "Let me check."},
                                   {"type": "tool_use", "id": "toolu_0", "name": "f", "input": {"a": 1}}],
                       "stop_reason": "tool_use", "stop_sequence": None,
                       "usage": {"input_tokens": 5, "output_tokens": 5}}


def test_reasoning_is_a_thinking_block() -> None:
    events, message = run(["<think>", "plan", "</think>", "\n\nanswer"], reasoning=True)
    assert message["content"] == [{"type": "thinking", "thinking": "plan", "signature": ""},
                                  {"type": "text", "text": "answer"}]
    assert ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "thinking_delta", "thinking": "plan"}}) in events


def test_stop_reasons() -> None:
    assert an.stop_reason_of("stop", None) == "end_turn"
    assert an.stop_reason_of("stop", "END") == "stop_sequence"
    assert an.stop_reason_of("length", None) == "max_tokens"
    assert an.stop_reason_of("tool_calls", None) == "tool_use"
    _, message = run(["a"], "stop", "END")
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")


def test_an_empty_answer_still_pings_and_ends() -> None:
    events, message = run([], "length")
    assert [name for name, _ in events] == ["message_start", "ping", "message_delta", "message_stop"]
    assert message["content"] == [] and message["stop_reason"] == "max_tokens"


def test_framing_and_error_envelope() -> None:
    assert an.sse_event("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert an.error_object(404, "no") == {"type": "error", "error": {"type": "not_found_error", "message": "no"}}
    assert [an.error_type_for(s) for s in (400, 401, 403, 413, 429, 500, 503)] == [
        "invalid_request_error", "authentication_error", "permission_error", "request_too_large",
        "rate_limit_error", "api_error", "overloaded_error"]
    assert an.error_body(QueueFullError("full", retry_after=1)) == \
        b'{"type":"error","error":{"type":"rate_limit_error","message":"full"}}'


def test_a_tool_calls_input_streams_in_pieces_and_a_cut_call_ends_with_an_empty_input() -> None:
    pieces = ["<tool_call>\n", '{"name": "f", ', '"arguments": {"a"', ": [1, ", "2]}}", "\n</tool_call>"]
    events, message = run(pieces, parse_tools=True)
    deltas = [obj["delta"]["partial_json"] for name, obj in events if name == "content_block_delta"]
    # The block opened with the first piece of input ({"a"), before the rest was decoded.
    assert deltas == ['{"a"', ": [1, ", "2]}"] and message["content"][0]["input"] == {"a": [1, 2]}
    events, message = run(pieces[:4], finish_reason="length", parse_tools=True)
    assert [obj["delta"]["partial_json"] for name, obj in events if name == "content_block_delta"] == \
        ['{"a"', ": [1, "]
    assert message["content"] == [{"type": "tool_use", "id": "toolu_0", "name": "f", "input": {}}]
    assert message["stop_reason"] == "max_tokens"
