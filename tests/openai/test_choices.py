"""Choice assembly over recorded delta sequences: streamed items add up to the non-streamed choice."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel_trio.openai.response.choices import CompletionChoice
from kestrel_trio.openai.response.logprobs import (
    CompletionLogprobs, LogprobToken, TokenLogprob, chat_logprobs, token_text,
)
from qwen3_choice import qwen3_choice as ChatChoice  # the output read as a Qwen3 model's

# A Qwen3 answer as the engine delivers it: one delta per token, tags split across deltas.
RECORDED = ["<think>", "\nhm", "m\n", "</think>", "\n\n", "Checking", ".\n\n", "<tool", "_call", ">\n",
            '{"name": "get_weather", ', '"arguments": {"city": ', '"Paris"}}', "\n</tool_call>"]


def ids():
    state = iter(range(1000))
    return lambda: f"call_{next(state)}"


def entry(text: str, logprob: float = -0.5) -> TokenLogprob:
    return TokenLogprob(LogprobToken(text.encode(), logprob), (LogprobToken(b"alt", -1.0),))


def stream(choice, deltas, finish_reason="stop", with_logprobs=False) -> list[dict]:
    items = list(choice.start())
    for text in deltas:
        items += choice.push(text, [entry(text)] if with_logprobs else [])
    return items + choice.finish(finish_reason)


def replay(items: list[dict]) -> dict:
    """What a client accumulates from streamed items (as the openai SDK does)."""
    content, reasoning, calls, logprobs, finish = "", "", {}, [], None
    for item in items:
        delta = item["delta"]
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls") or []:
            slot = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
            slot["id"] = call.get("id") or slot["id"]
            slot["name"] += call.get("function", {}).get("name") or ""
            slot["arguments"] += call["function"].get("arguments") or ""
        logprobs += (item["logprobs"] or {}).get("content") or []
        finish = item["finish_reason"] or finish
    return {"content": content, "reasoning": reasoning, "calls": calls, "logprobs": logprobs, "finish": finish}


def test_reasoning_text_and_a_tool_call_streamed_and_whole():
    streamed = ChatChoice(0, reasoning=True, parse_tools=True, make_id=ids())
    items = stream(streamed, RECORDED)
    whole = ChatChoice(0, reasoning=True, parse_tools=True, make_id=ids())
    whole.push("".join(RECORDED))
    whole.finish("stop")
    choice = whole.message_choice()

    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["reasoning_content"] == "hmm\n"
    assert message["content"] == "Checking."
    assert message["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    seen = replay(items)
    assert seen["content"] == message["content"] and seen["reasoning"] == message["reasoning_content"]
    assert seen["calls"] == {0: {"id": "call_0", "name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert seen["finish"] == "tool_calls"
    assert not any("<tool" in (i["delta"].get("content") or "") for i in items)


def test_a_tool_call_streams_as_openai_does():
    items = stream(ChatChoice(2, parse_tools=True, make_id=ids()), RECORDED[7:])
    tool_items = [i for i in items if "tool_calls" in i["delta"]]
    # The opening as soon as the name is read, then each delta's piece of the arguments as it comes.
    assert [i["delta"]["tool_calls"] for i in tool_items] == [
        [{"index": 0, "id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": ""}}],
        [{"index": 0, "function": {"arguments": '{"city": '}}],
        [{"index": 0, "function": {"arguments": '"Paris"}'}}],
    ]
    assert all(i["index"] == 2 for i in items)
    assert items[0]["delta"] == {"role": "assistant", "content": ""}
    assert items[-1] == {"index": 2, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}


def test_only_calls_means_null_content_and_a_cut_call_keeps_length():
    done = ChatChoice(parse_tools=True, make_id=ids())
    stream(done, RECORDED[7:])
    assert done.message_choice()["message"]["content"] is None
    cut = ChatChoice(parse_tools=True, make_id=ids())
    items = stream(cut, RECORDED[7:11], finish_reason="length")
    message = cut.message_choice()["message"]
    assert cut.message_choice()["finish_reason"] == "length"
    assert "tool_calls" not in message and message["content"] == "".join(RECORDED[7:11])
    assert replay(items)["content"] == message["content"]


TWO_CALLS = RECORDED[7:] + ["\n<tool_call>\n", '{"name": "get_time", "arguments": {}}', "\n</tool_call>"]


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_false_keeps_only_the_first_call(parallel):
    streamed = ChatChoice(parse_tools=True, make_id=ids(), parallel_tool_calls=parallel, logprobs=True)
    items = stream(streamed, TWO_CALLS, with_logprobs=True)
    whole = ChatChoice(parse_tools=True, make_id=ids(), parallel_tool_calls=parallel)
    whole.push("".join(TWO_CALLS))
    whole.finish("stop")
    names = [call["function"]["name"] for call in whole.message_choice()["message"]["tool_calls"]]
    assert names == (["get_weather", "get_time"] if parallel else ["get_weather"])
    seen = replay(items)
    assert [call["name"] for call in seen["calls"].values()] == names
    assert seen["finish"] == "tool_calls" and seen["content"] == ""
    assert len(seen["logprobs"]) == len(TWO_CALLS)  # a dropped call's tokens still count in logprobs


def test_without_tool_parsing_the_tags_are_plain_content():
    choice = ChatChoice(parse_tools=False)
    items = stream(choice, RECORDED[7:])
    assert replay(items)["content"] == "".join(RECORDED[7:]) == choice.message_choice()["message"]["content"]
    assert choice.message_choice()["finish_reason"] == "stop"


@pytest.mark.parametrize("tools", [False, True])
def test_logprobs_are_sent_once_each_in_order(tools):
    choice = ChatChoice(parse_tools=tools, logprobs=True, make_id=ids())
    items = stream(choice, RECORDED[5:], with_logprobs=True)
    sent = replay(items)["logprobs"]
    assert [e["token"] for e in sent] == RECORDED[5:]
    assert sent == choice.message_choice()["logprobs"]["content"]
    assert sent[0] == {"token": "Checking", "logprob": -0.5, "bytes": list(b"Checking"),
                       "top_logprobs": [{"token": "alt", "logprob": -1.0, "bytes": list(b"alt")}]}


def test_token_text_of_a_partial_character_and_infinite_logprobs():
    assert token_text("é".encode()) == "é"
    assert token_text("é".encode()[:1]) == "bytes:\\xc3"
    body = chat_logprobs([TokenLogprob(LogprobToken(b"x", float("-inf")))])
    assert body["content"][0]["logprob"] == -9999.0
    json.dumps(body, allow_nan=False)


def test_completion_choice_offsets_and_pending_logprobs():
    parts = [("Hel", "Hel"), ("lo", "lo\xe2"), ("…", "\x80\xa6")]  # (emitted text, token bytes as latin-1)
    choice = CompletionChoice(1, echo="Say: ", logprobs=True)
    items = choice.start()
    for text, raw in parts:
        items += choice.push(text, [TokenLogprob(LogprobToken(raw.encode("latin-1"), -0.25))])
    items += choice.finish("length")
    full = choice.full_choice()
    assert full["text"] == "Say: Hello…" == "".join(i["text"] for i in items)
    assert full["logprobs"]["tokens"] == ["Hel", "bytes:\\x6c\\x6f\\xe2", "bytes:\\x80\\xa6"]
    assert full["logprobs"]["text_offset"] == [5, 8, 10]
    assert full["logprobs"]["token_logprobs"] == [-0.25] * 3
    assert full["logprobs"]["top_logprobs"][0] == {"Hel": -0.25}
    streamed = [t for i in items if i["logprobs"] for t in i["logprobs"]["tokens"]]
    assert streamed == full["logprobs"]["tokens"]
    assert [o for i in items if i["logprobs"] for o in i["logprobs"]["text_offset"]] == [5, 8, 10]
    assert items[-1]["finish_reason"] == "length" and all(i["index"] == 1 for i in items)


def test_completion_logprobs_builder_counts_characters_not_bytes():
    builder = CompletionLogprobs(start_offset=2)
    out = builder.build([TokenLogprob(LogprobToken("日本".encode(), -1.0)), TokenLogprob(LogprobToken(b"x", -2.0))])
    assert out["text_offset"] == [2, 4]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len("".join(RECORDED))), max_size=15))
def test_any_cut_of_the_output_into_deltas_streams_the_same_answer(cuts):
    text = "".join(RECORDED)
    points = sorted(set(cuts))
    deltas = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    choice = ChatChoice(0, reasoning=True, parse_tools=True, make_id=ids())
    seen = replay(stream(choice, deltas))
    assert seen == {"content": "Checking.", "reasoning": "hmm\n", "logprobs": [], "finish": "tool_calls",
                    "calls": {0: {"id": "call_0", "name": "get_weather", "arguments": '{"city": "Paris"}'}}}
    assert choice.message_choice()["message"]["content"] == "Checking."


def test_a_call_cut_inside_its_arguments_stays_a_call_with_the_text_written():
    cut = ChatChoice(parse_tools=True, make_id=ids())
    items = stream(cut, RECORDED[7:12], finish_reason="length")
    choice = cut.message_choice()
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": '}}]
    assert replay(items)["calls"] == {0: {"id": "call_0", "name": "get_weather", "arguments": '{"city": '}}


def test_a_forced_named_call_opens_with_the_first_argument_token():
    prefix = '<tool_call>\n{"name": "get_weather", "arguments": '
    choice = ChatChoice(parse_tools=True, forced_prefix=prefix, make_id=ids())
    items = stream(choice, ['{"city"', ': "Oslo"}', "}\n</tool_call>"])
    calls = [i["delta"]["tool_calls"][0] for i in items if "tool_calls" in i["delta"]]
    assert calls[0] == {"index": 0, "id": "call_0", "type": "function",
                        "function": {"name": "get_weather", "arguments": ""}}
    assert [c["function"]["arguments"] for c in calls[1:]] == ['{"city"', ': "Oslo"}']
    assert choice.message_choice()["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'


def test_the_message_says_refusal_null_as_openais_spec_requires():
    choice = ChatChoice()
    stream(choice, ["Hi"])
    assert choice.message_choice()["message"] == {"role": "assistant", "content": "Hi", "refusal": None}
