"""The sans-IO Qwen3 tool-call parser: tags split anywhere, several calls, malformed JSON, text around calls."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel_trio.openai.tool_calls import (
    ToolCall,
    ToolCallParser,
    forced_tool_prefix,
    parse_tool_calls,
)

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
ANSWER = "Let me check that.\n\n" + WEATHER + "\n" + TIME


def counter():
    state = iter(range(1000))
    return lambda: f"call_{next(state)}"


def run(pieces: list[str]) -> list:
    """Feed ``pieces`` one by one; returns the output with adjacent text merged."""
    parser = ToolCallParser(counter())
    out: list = []
    for piece in pieces:
        out.extend(parser.push(piece))
    out.extend(parser.flush())
    merged: list = []
    for item in out:
        if isinstance(item, str) and merged and isinstance(merged[-1], str):
            merged[-1] += item
        else:
            merged.append(item)
    return merged


def test_text_then_two_calls():
    content, calls = parse_tool_calls(ANSWER, counter())
    assert content == "Let me check that."
    assert calls == (
        ToolCall("call_0", "get_weather", '{"city": "Paris", "unit": "°C"}'),
        ToolCall("call_1", "get_time", "{}"),
    )
    assert json.loads(calls[0].arguments) == {"city": "Paris", "unit": "°C"}


def test_plain_text_is_untouched_even_with_whitespace_and_lookalikes():
    for text in ["", "hello", "a  b \n\n", "x < y and <tool> is not a tag", "<tool_cal", "ends with <"]:
        assert parse_tool_calls(text) == (text, ())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(ANSWER)), max_size=12))
def test_any_split_gives_the_same_result(cuts):
    points = sorted(set(cuts))
    pieces = [ANSWER[a:b] for a, b in zip([0, *points], [*points, len(ANSWER)])]
    assert run(pieces) == run([ANSWER])
    assert run(pieces) == [
        "Let me check that.",
        ToolCall("call_0", "get_weather", '{"city": "Paris", "unit": "°C"}'),
        ToolCall("call_1", "get_time", "{}"),
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=200), max_size=8), st.sampled_from([
    "<tool_call>\n{not json}\n</tool_call>",
    '<tool_call>\n{"arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
    '<tool_call>\n["name"]\n</tool_call>',
]))
def test_malformed_calls_degrade_to_the_literal_text_at_any_split(cuts, bad):
    text = "Before " + bad + " after"
    points = sorted({c for c in cuts if c <= len(text)})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    assert run(pieces) == [text]


def test_a_good_call_after_a_malformed_one_is_still_parsed():
    text = "<tool_call>{oops</tool_call>" + WEATHER
    out = run([text])
    assert out[0] == "<tool_call>{oops</tool_call>"
    assert isinstance(out[1], ToolCall) and out[1].name == "get_weather"


def test_text_after_a_call_is_content_without_the_framing_newlines():
    assert run([WEATHER + "\n\nDone, it is sunny."])[1] == "Done, it is sunny."
    # whitespace inside text after the call is kept
    assert run([WEATHER + "\nA  B", " C\n"])[1] == "A  B C"


def test_an_unclosed_call_is_accepted_only_when_complete():
    content, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n')
    assert (content, [c.name for c in calls]) == ("", ["f"])
    truncated = 'Hi <tool_call>\n{"name": "f", "argu'
    assert parse_tool_calls(truncated) == (truncated, ())


def test_arguments_may_be_a_json_string_or_absent():
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}</tool_call>')
    assert calls[0].arguments == '{"a": 2}'
    _, calls = parse_tool_calls('<tool_call>{"name": "f"}</tool_call>')
    assert calls[0].arguments == "{}"
    bad = '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>'
    assert parse_tool_calls(bad) == (bad, ())


def test_ids_are_fresh_random_hex():
    _, first = parse_tool_calls(WEATHER)
    _, second = parse_tool_calls(WEATHER)
    assert first[0].id.startswith("call_") and len(first[0].id) == len("call_") + 24
    int(first[0].id[len("call_"):], 16)
    assert first[0].id != second[0].id


def test_forced_prefix_makes_the_rest_of_a_call_parse():
    named = forced_tool_prefix({"type": "function", "function": {"name": "get_weather"}})
    assert named == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert forced_tool_prefix("required") == "<tool_call>\n"
    assert forced_tool_prefix("auto") == forced_tool_prefix("none") == ""
    parser = ToolCallParser(counter())
    assert parser.push(named) == []
    assert parser.push('{"city": "Oslo"}}\n</tool_call>') == [ToolCall("call_0", "get_weather", '{"city": "Oslo"}')]
