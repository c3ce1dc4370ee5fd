"""No request field silently ignored: each key acts, is a documented no-op, or is refused naming it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai import (
    parse_chat_request,
    parse_completion_request,
    parse_detokenize_request,
    parse_tokenize_request,
)
from kestrel_trio.openai.request.accepted_fields import NO_OP_FIELDS, REFUSED_FIELDS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
USER = {"role": "user", "content": "hi"}
PNG = "data:image/png;base64,iVBORw0KGgo="
PARSERS = {
    "chat": lambda obj: parse_chat_request(json.dumps(obj).encode(), allow_images=True),
    "completions": lambda obj: parse_completion_request(json.dumps(obj).encode()),
    "tokenize": lambda obj: parse_tokenize_request(json.dumps(obj).encode()),
    "detokenize": lambda obj: parse_detokenize_request(json.dumps(obj).encode()),
}
MINIMAL = {"chat": {"messages": [USER]}, "completions": {"prompt": "hi"}, "tokenize": {"messages": [USER]},
           "detokenize": {"tokens": [1]}}

# Bodies as the clients people point at this server send them, captured from real runs against
# kestrel-trio (langchain-openai 1.7.4, litellm 1.110.2, openai 3.57; model id shortened).
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {
    "properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"}}}
CALL = {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
CLIENT_BODIES = {
    "langchain invoke": {"model": "m", "stream": False, "messages": [{"content": "hi", "role": "user"}],
                         "max_completion_tokens": 8},
    "langchain sampling": {"model": "m", "stream": False, "messages": [USER], "max_completion_tokens": 8, "n": 1,
                           "stop": ["\n"], "temperature": 0.0},
    "langchain stream_usage": {"model": "m", "stream": True, "messages": [USER], "max_completion_tokens": 8,
                               "stream_options": {"include_usage": True}},
    "langchain tool history": {"model": "m", "stream": False, "messages": [
        {"content": "be brief", "role": "system"}, {"content": "weather in Paris?", "name": "alice", "role": "user"},
        {"content": None, "role": "assistant", "tool_calls": [CALL]},
        {"content": "sunny", "role": "tool", "tool_call_id": "call_1"}, {"content": "thanks", "role": "user"}],
        "max_completion_tokens": 8, "tools": [TOOL]},
    "langchain bind_tools(strict, parallel_tool_calls=False)": {
        "model": "m", "stream": False, "messages": [USER], "max_completion_tokens": 8, "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "tools": [{"type": "function", "function": {**TOOL["function"], "strict": True}}]},
    "litellm completion": {"model": "m", "messages": [USER], "max_tokens": 8},
    "litellm stream": {"model": "m", "messages": [USER], "max_tokens": 8, "stream": True,
                       "stream_options": {"include_usage": True}},
    "litellm sampling": {"model": "m", "messages": [USER], "temperature": 0.2, "top_p": 0.9, "max_tokens": 8, "seed": 3},
    "litellm tools": {"model": "m", "messages": [USER], "max_tokens": 8, "tools": [TOOL], "tool_choice": "auto"},
    "litellm message passed back": {"model": "m", "max_tokens": 8, "tools": [TOOL], "messages": [
        USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "x"}]},
    # This server's own answer message, passed back by a client as it came (reasoning_content included).
    "own answer passed back": {"model": "m", "messages": [USER, {
        "role": "assistant", "content": None, "reasoning_content": "hmm", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]},
}


def refused(endpoint: str, obj: dict, param: str, *fragments: str) -> BadRequestError:
    with pytest.raises(BadRequestError) as info:
        PARSERS[endpoint](obj)
    assert info.value.param == param, info.value.message
    assert info.value.status == 400
    for fragment in fragments:
        assert fragment in info.value.message
    return info.value


@pytest.mark.parametrize("label", sorted(CLIENT_BODIES))
def test_the_bodies_langchain_litellm_and_the_openai_client_send_are_accepted(label: str) -> None:
    PARSERS["chat"](CLIENT_BODIES[label])


def test_litellm_text_completion_body_is_accepted() -> None:
    PARSERS["completions"]({"model": "m", "prompt": "hi", "max_tokens": 8})


@pytest.mark.parametrize("endpoint", sorted(PARSERS))
@pytest.mark.parametrize("value", [1, None, {"x": 1}])
def test_an_unknown_field_is_refused_naming_it_whatever_its_value(endpoint: str, value) -> None:
    refused(endpoint, {**MINIMAL[endpoint], "frobnicate": value}, "frobnicate", "Unrecognized request argument")


@pytest.mark.parametrize(("endpoint", "field"), [
    ("chat", "guided_json"), ("chat", "echo"), ("chat", "best_of"), ("chat", "suffix"), ("chat", "prompt"),
    ("completions", "messages"), ("completions", "tools"), ("completions", "top_logprobs"),
    ("completions", "chat_template_kwargs"), ("tokenize", "response_format"), ("tokenize", "tools"),
])
def test_a_field_of_another_endpoint_is_refused_not_ignored(endpoint: str, field: str) -> None:
    error = refused(endpoint, {**MINIMAL[endpoint], field: 1}, field)
    assert field in error.message


def test_response_format_text_changes_nothing_and_the_json_kinds_act() -> None:
    baseline = PARSERS["chat"](MINIMAL["chat"])
    assert PARSERS["chat"]({**MINIMAL["chat"], "response_format": {"type": "text"}}) == baseline
    for kind in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}):
        assert PARSERS["chat"]({**MINIMAL["chat"], "response_format": kind}).structured is not None
    refused("chat", {**MINIMAL["chat"], "response_format": {"type": "text", "extra": 1}}, "response_format.extra",
            "Unrecognized")
    refused("chat", {**MINIMAL["chat"], "response_format": "text"}, "response_format")


# A value each no-op accepts, and one it refuses (None: it accepts every value of its type).
NO_OP_VALUES = {
    "user": ("u-17", 17),
    "safety_identifier": ("hash", ["x"]),
    "metadata": ({"run": "7"}, "run 7"),
    "store": (True, "yes"),
    "prompt_cache_key": ("k", 1),
    "prompt_cache_retention": ("24h", 24),
    "prompt_cache_options": ({"ttl": "30m"}, "30m"),
    "service_tier": ("default", "flex"),
    "modalities": (["text"], ["text", "audio"]),
    "verbosity": ("medium", "low"),
    "stream_options.include_obfuscation": (False, True),
    "best_of": (1, 2),
    "messages[].name": ("alice", 3),
    "messages[].content[].image_url.detail": ("low", "ultra"),
    "tools[].function.strict": (True, "no"),
}


def placed(field: str, value, endpoint: str) -> tuple[dict, str]:
    """A minimal body of ``endpoint`` holding ``value`` at the generic ``field``, and the field's concrete path."""
    body = dict(MINIMAL[endpoint])
    if field == "stream_options.include_obfuscation":
        return {**body, "stream": True, "stream_options": {"include_obfuscation": value}}, field
    if field == "messages[].name":
        return {**body, "messages": [{**USER, "name": value}]}, "messages[0].name"
    if field == "messages[].content[].image_url.detail":
        part = {"type": "image_url", "image_url": {"url": PNG, "detail": value}}
        return {**body, "messages": [{"role": "user", "content": [part]}]}, "messages[0].content[0].image_url.detail"
    if field == "tools[].function.strict":
        return {**body, "tools": [{"type": "function", "function": {"name": "f", "strict": value}}]}, \
            "tools[0].function.strict"
    assert "." not in field and "[" not in field, f"placed() does not know where {field} goes"
    return {**body, field: value}, field


def test_every_no_op_field_has_test_values() -> None:
    assert sorted(NO_OP_VALUES) == sorted(field.field for field in NO_OP_FIELDS)


@pytest.mark.parametrize("no_op", NO_OP_FIELDS, ids=lambda field: field.field)
def test_each_no_op_accepts_its_values_and_changes_nothing_else_it_refuses(no_op) -> None:
    good, bad = NO_OP_VALUES[no_op.field]
    for endpoint in sorted(no_op.endpoints):
        body, path = placed(no_op.field, good, endpoint)
        accepted = PARSERS[endpoint](body)
        if "." not in no_op.field:  # a top-level no-op leaves the parsed request exactly as without it
            assert accepted == PARSERS[endpoint](MINIMAL[endpoint])
        refused(endpoint, placed(no_op.field, bad, endpoint)[0], path)
    for endpoint in sorted(set(PARSERS) - no_op.endpoints):
        if "." not in no_op.field:  # elsewhere it is not a no-op: refused like any field that would be ignored
            refused(endpoint, placed(no_op.field, good, endpoint)[0], no_op.field)


@pytest.mark.parametrize("field", [f for f in REFUSED_FIELDS if "." not in f])
def test_each_refused_top_level_field_names_itself_unless_null(field: str) -> None:
    refused("chat", {**MINIMAL["chat"], field: {"any": "value"}}, field)
    PARSERS["chat"]({**MINIMAL["chat"], field: None})


@pytest.mark.parametrize(("message", "param", "fragment"), [
    ({**USER, "tool_call_id": "c"}, "messages[0].tool_call_id", "Unrecognized"),
    ({**USER, "tool_calls": [CALL]}, "messages[0].tool_calls", "Unrecognized"),
    ({**USER, "cache_control": {"type": "ephemeral"}}, "messages[0].cache_control", "Unrecognized"),
    ({"role": "assistant", "content": "x", "refusal": "no"}, "messages[0].refusal", "'content'"),
    ({"role": "assistant", "content": "x", "function_call": {"name": "f"}}, "messages[0].function_call", "tool_calls"),
    ({"role": "assistant", "content": "x", "audio": {"id": "a"}}, "messages[0].audio", "audio"),
    ({"role": "assistant", "tool_calls": [{**CALL, "index": 0}]}, "messages[0].tool_calls[0].index", "Unrecognized"),
    ({"role": "assistant", "tool_calls": [{**CALL, "function": {**CALL["function"], "x": 1}}]},
     "messages[0].tool_calls[0].function.x", "Unrecognized"),
    ({"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}]},
     "messages[0].content[0].cache_control", "Unrecognized"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG, "size": 3}}]},
     "messages[0].content[0].image_url.size", "Unrecognized"),
])
def test_unknown_message_keys_are_refused_naming_the_path(message: dict, param: str, fragment: str) -> None:
    refused("chat", {"messages": [message]}, param, fragment)


def test_null_message_fields_an_sdk_sends_back_are_accepted() -> None:
    message = {"role": "assistant", "content": "x", "refusal": None, "function_call": None, "audio": None,
               "tool_calls": None, "name": None}
    assert PARSERS["chat"]({"messages": [USER, message]}).messages[1] == {"role": "assistant", "content": "x"}


def test_stream_options_and_tool_choice_refuse_unknown_keys() -> None:
    base = {**MINIMAL["chat"], "stream": True}
    refused("chat", {**base, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats", "Unrecognized")
    refused("completions", {"prompt": "x", "stream": True, "stream_options": {"x": 1}}, "stream_options.x")
    refused("chat", {**MINIMAL["chat"], "tools": [TOOL], "tool_choice": {**CLIENT_BODIES[
        "langchain bind_tools(strict, parallel_tool_calls=False)"]["tool_choice"], "x": 1}}, "tool_choice.x")


def test_parallel_tool_calls_is_read_and_must_be_a_boolean() -> None:
    assert PARSERS["chat"](MINIMAL["chat"]).parallel_tool_calls is True
    assert PARSERS["chat"]({**MINIMAL["chat"], "parallel_tool_calls": False}).parallel_tool_calls is False
    refused("chat", {**MINIMAL["chat"], "parallel_tool_calls": "no"}, "parallel_tool_calls", "boolean")


def test_docs_list_every_no_op_and_every_refused_field() -> None:
    text = DOCS.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE))
    for field in [no_op.field for no_op in NO_OP_FIELDS] + list(REFUSED_FIELDS):
        assert field in documented, f"docs/api.md has no table row for `{field}`"


@pytest.mark.parametrize(("doc", "sentence"), [
    ("README.md", r"and the refused ones \((.*?)\)\."),
    ("docs/operations.md", r"a known one the server cannot honour \(e\.g\. (.*?)\) \|"),
], ids=["README", "operations"])
def test_the_fields_other_docs_give_as_refused_are_refused(doc: str, sentence: str) -> None:
    # Structured outputs exist: response_format is a field that acts, not an example of a refused one.
    text = " ".join((DOCS.parents[1] / doc).read_text(encoding="utf-8").split())
    match = re.search(sentence, text, flags=re.DOTALL)
    assert match is not None, f"{doc} no longer has the sentence this test reads: update the test"
    named = re.findall(r"`([^`]+)`", match.group(1))
    assert named and all(field in REFUSED_FIELDS for field in named), (doc, named)
    for field in named:
        refused("chat", {**MINIMAL["chat"], field: {"x": 1}}, field)
