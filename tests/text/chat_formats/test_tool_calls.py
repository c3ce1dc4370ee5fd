"""The sans-IO tool-call parser at Hermes' tags (Qwen3's): tags split anywhere, several calls, malformed JSON, text
around calls; and the prefix a forced tool_choice writes."""

from __future__ import annotations

import functools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel_trio.text.chat_formats import hermes, tool_calls
from kestrel_trio.text.chat_formats.hermes import forced_tool_prefix
from kestrel_trio.text.chat_formats.tool_calls import CallArguments, CallStart, ToolCall

# The family-neutral parser at Hermes' tags, as the server runs it.
ToolCallParser = functools.partial(tool_calls.ToolCallParser, hermes.TAGS)
parse_tool_calls = functools.partial(tool_calls.parse_tool_calls, hermes.TAGS)

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
ANSWER = "Let me check that.\n\n" + WEATHER + "\n" + TIME


def counter():
    state = iter(range(1000))
    return lambda: f"call_{next(state)}"


def raw(pieces: list[str]) -> list:
    """Feed ``pieces`` one by one; returns every piece the parser released, in order."""
    parser = ToolCallParser(counter())
    out: list = []
    for piece in pieces:
        out.extend(parser.push(piece))
    return out + parser.flush()


def run(pieces: list[str]) -> list:
    """Feed ``pieces`` one by one; returns the output with adjacent text merged and each call whole."""
    merged: list = []
    for item in raw(pieces):
        if isinstance(item, str) and merged and isinstance(merged[-1], str):
            merged[-1] += item
        elif isinstance(item, CallStart):
            merged.append(ToolCall(item.id, item.name, ""))
        elif isinstance(item, CallArguments):
            merged[-1] = ToolCall(merged[-1].id, merged[-1].name, merged[-1].arguments + item.text)
        else:
            merged.append(item)
    return merged


def split(text: str, cuts) -> list[str]:
    points = sorted({c for c in cuts if c <= len(text)})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


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
    assert parser.push('{"city": "Oslo"}}\n</tool_call>') == [CallStart("call_0", "get_weather"),
                                                             CallArguments('{"city": "Oslo"}')]


def test_a_call_opens_as_soon_as_its_head_is_read_and_its_arguments_come_in_pieces():
    out = raw(list(WEATHER))  # one character at a time
    start = out.index(CallStart("call_0", "get_weather"))
    # The head (tag, name, the arguments' first brace) is all that was read when the call opened.
    assert out[start + 1] == CallArguments("{")
    pieces = [p.text for p in out[start + 1:] if isinstance(p, CallArguments)]
    assert len(pieces) == len('{"city": "Paris", "unit": "°C"}')
    assert "".join(pieces) == '{"city": "Paris", "unit": "°C"}'


def test_every_cut_in_two_gives_the_same_calls_with_arguments_as_written():
    text = "Sure: " + WEATHER + "\n" + TIME + "\nthanks"
    whole = run([text])
    assert whole == ["Sure:", ToolCall("call_0", "get_weather", '{"city": "Paris", "unit": "°C"}'),
                     ToolCall("call_1", "get_time", "{}"), "thanks"]
    for cut in range(len(text) + 1):
        assert run([text[:cut], text[cut:]]) == whole, cut


# Arguments objects the model may write: nested values, strings holding braces, quotes, escapes and tag-like text.
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                     st.text(alphabet=st.sampled_from('ab{}[]"\\/<>é\n:,'), max_size=8))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                       max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(alphabet="xyz_", min_size=1, max_size=5), _values, max_size=4),
       st.sampled_from([None, 2]), st.lists(st.integers(min_value=0, max_value=400), max_size=15))
def test_streamed_arguments_add_up_to_the_written_object_at_any_split(arguments, indent, cuts):
    written = json.dumps(arguments, ensure_ascii=False, indent=indent)
    text = 'Hm.\n<tool_call>\n{"name": "f", "arguments": ' + written + '}\n</tool_call>'
    out = raw(split(text, cuts))
    assert run(split(text, cuts)) == ["Hm.", ToolCall("call_0", "f", written)]
    assert json.loads("".join(p.text for p in out if isinstance(p, CallArguments))) == arguments
    start = out.index(CallStart("call_0", "f"))
    assert all(isinstance(p, str) for p in out[:start]) and all(isinstance(p, CallArguments) for p in out[start + 1:])


def test_tag_like_text_inside_the_arguments_is_held_back_then_sent():
    text = '<tool_call>{"name": "f", "arguments": {"html": "a</b> <tool_call> </tool_"}}</tool_call>'
    assert run(split(text, range(0, len(text), 3))) == [
        ToolCall("call_0", "f", '{"html": "a</b> <tool_call> </tool_"}')]


def test_a_committed_call_cut_off_keeps_the_arguments_written_so_far():
    assert run(['Hi <tool_call>\n{"name": "f", "arguments": {"x": [1, 2']) == [
        "Hi", ToolCall("call_0", "f", '{"x": [1, 2')]
    # Closed before its arguments were: still the call, the arguments as written.
    assert run(['<tool_call>{"name": "f", "arguments": {"x": </tool_call> after']) == [
        ToolCall("call_0", "f", '{"x": '), "after"]


def test_what_follows_the_arguments_inside_the_call_is_framing():
    text = '<tool_call>{"name": "f", "arguments": {"a": 1}, "id": 7}\n</tool_call>'
    assert run([text]) == [ToolCall("call_0", "f", '{"a": 1}')]


def test_other_shapes_are_read_whole_at_the_closing_tag():
    text = '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>'
    out = raw(split(text, range(len(text))))
    assert out == [CallStart("call_0", "f"), CallArguments('{"a": 1}')]
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "parameters": {"b": 2}}</tool_call>')
    assert [(call.name, call.arguments) for call in calls] == [("f", '{"b": 2}')]
