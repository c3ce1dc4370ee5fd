"""The Hermes/Qwen tool fallback as plain messages (kestrel_trio.text.chat_formats.hermes), and its answers parsed
back."""

from __future__ import annotations

import copy
import functools
import itertools
import json

import pytest

from kestrel_trio.text import ChatTemplate, Tokenizer
from kestrel_trio.text.chat_formats import hermes, tool_calls
from kestrel_trio.text.chat_formats.hermes import (
    call_text,
    has_tool_turns,
    tool_names,
    tool_system_prompt,
    tool_turns_as_text,
    with_tool_system_prompt,
)

parse_tool_calls = functools.partial(tool_calls.parse_tool_calls, hermes.TAGS)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time"}},
]


def call(name: str, arguments: object, ident: str = "call_1") -> dict:
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_the_system_prompt_is_the_one_qwen3s_template_writes(qwen_tokenizer: Tokenizer) -> None:
    qwen = ChatTemplate(qwen_tokenizer.chat_template, special_tokens=qwen_tokenizer.special_tokens_map)
    block = tool_system_prompt(TOOLS)
    assert f"<|im_start|>system\n{block}<|im_end|>\n" in qwen.render([{"role": "user", "content": "x"}], tools=TOOLS)
    assert f"<|im_start|>system\nBe brief.\n\n{block}<|im_end|>\n" in qwen.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}], tools=TOOLS)


def test_the_system_prompt_lists_each_tool_as_one_json_line_and_asks_for_tool_call_tags() -> None:
    block = tool_system_prompt(TOOLS)
    lines = block.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].split("\n")
    assert [json.loads(line) for line in lines] == TOOLS
    assert block.endswith('<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    assert tool_names(TOOLS) == ["get_weather", "get_time"]
    assert tool_names([{"name": "flat"}, {"function": {}}]) == []  # no OpenAI-style name: none to look for


def test_the_tools_join_a_leading_system_message_or_become_one() -> None:
    block = tool_system_prompt(TOOLS)
    user = {"role": "user", "content": "hi"}
    system = {"role": "system", "content": "Be brief."}
    messages = [system, user]
    assert with_tool_system_prompt(messages, TOOLS) == [{"role": "system", "content": "Be brief.\n\n" + block}, user]
    assert messages == [system, user]  # not modified
    assert with_tool_system_prompt([user], TOOLS) == [{"role": "system", "content": block}, user]
    assert with_tool_system_prompt([{"role": "system", "content": ""}, user], TOOLS)[0]["content"] == block
    # A later system message is not the system prompt: the tools go first.
    assert with_tool_system_prompt([user, system], TOOLS) == [{"role": "system", "content": block}, user, system]


def test_calls_become_tool_call_blocks_after_the_text_and_results_user_turns() -> None:
    messages = [
        {"role": "user", "content": "Weather and time in Oslo?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Two tools.",
         "tool_calls": [call("get_weather", {"city": "Oslo"}), call("get_time", '{"tz":"CET"}', "call_2")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "12:00"}]},
        {"role": "assistant", "content": "It is 18 C at noon."},
        {"role": "tool", "tool_call_id": "call_3", "content": "late"},
    ]
    pristine = copy.deepcopy(messages)
    assert has_tool_turns(messages) and not has_tool_turns([messages[0], messages[4]])
    assert tool_turns_as_text(messages) == [
        messages[0],
        {"role": "assistant", "reasoning_content": "Two tools.", "content":
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {"tz":"CET"}}\n</tool_call>'},  # a string: as sent
        {"role": "user",
         "content": "<tool_response>\n18 C\n</tool_response>\n<tool_response>\n12:00\n</tool_response>"},
        messages[4],
        {"role": "user", "content": "<tool_response>\nlate\n</tool_response>"},
    ]
    assert messages == pristine


def test_an_assistant_message_of_calls_only_is_the_calls() -> None:
    [rewritten] = tool_turns_as_text([{"role": "assistant", "tool_calls": [call("get_time", {})]}])
    assert rewritten == {"role": "assistant",
                         "content": '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'}


def test_an_answer_in_the_prompts_format_parses_into_openai_tool_calls() -> None:
    """What the fallback prompt asks a model to write is what the <tool_call> parser reads."""
    answer = ('I will look it up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    ids = (f"call_{i}" for i in itertools.count())
    content, calls = parse_tool_calls(answer, make_id=lambda: next(ids))
    assert content == "I will look it up."
    assert calls == (tool_calls.ToolCall("call_0", "get_weather", '{"city": "Oslo"}'),
                     tool_calls.ToolCall("call_1", "get_time", "{}"))


@pytest.mark.parametrize("arguments", [{"city": "Zürich", "days": [1, 2]}, '{"city":"Zürich"}', {}])
def test_an_assistants_calls_written_as_text_parse_back_to_the_same_calls(arguments: object) -> None:
    [rewritten] = tool_turns_as_text([{"role": "assistant", "content": "Sure.",
                                       "tool_calls": [call("get_weather", arguments)]}])
    content, calls = parse_tool_calls(rewritten["content"])
    expected = arguments if isinstance(arguments, dict) else json.loads(arguments)
    assert content == "Sure." and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", expected)]


def test_a_call_cut_before_its_arguments_closed_is_written_as_the_model_wrote_it() -> None:
    """``call_text(closed=False)`` stops where the arguments stop; closed, it parses back to the same call."""
    assert call_text("f", '{"x": [1') == '<tool_call>\n{"name": "f", "arguments": {"x": [1}\n</tool_call>'
    assert call_text("f", '{"x": [1', closed=False) == '<tool_call>\n{"name": "f", "arguments": {"x": [1'
    _, calls = parse_tool_calls(call_text("f", '{"x": [1]}'))
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"x": [1]}')]
