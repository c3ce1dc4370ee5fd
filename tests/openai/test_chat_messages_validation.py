"""Chat messages, tools and tool_choice: normalization and errors naming nested fields."""

from __future__ import annotations

import json

import pytest

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai import parse_chat_request

USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def parse(messages, allow_images: bool = False, **fields):
    return parse_chat_request(json.dumps({"messages": messages, **fields}).encode(), allow_images=allow_images)


def rejected(messages, param: str, *fragments: str, allow_images: bool = False, **fields) -> BadRequestError:
    raw = json.dumps({"messages": messages, **fields}).encode()
    with pytest.raises(BadRequestError) as info:
        parse_chat_request(raw, allow_images=allow_images)
    assert info.value.param == param, info.value.message
    for fragment in fragments:
        assert fragment in info.value.message
    return info.value


def test_roles_and_developer_mapping():
    messages = [
        {"role": "developer", "content": "be terse"},
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q", "name": "alice"},
        {"role": "assistant", "content": "a"},
    ]
    assert parse(messages).messages == (
        {"role": "system", "content": "be terse"},
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q", "name": "alice"},
        {"role": "assistant", "content": "a"},
    )


def test_messages_presence_and_shape():
    with pytest.raises(BadRequestError) as info:
        parse_chat_request(b"{}")
    assert info.value.param == "messages"
    rejected(None, "messages", "required")
    rejected([], "messages", "at least one")
    rejected({"role": "user"}, "messages", "must be an array, got object")
    rejected([USER, "hello"], "messages[1]", "must be an object, got string")
    rejected([USER, {"content": "x"}], "messages[1].role", "required")
    rejected([USER, {"role": "robot", "content": "x"}], "messages[1].role", "robot")
    rejected([{"role": 3, "content": "x"}], "messages[0].role", "must be a string")
    rejected([{"role": "user", "content": "x", "name": 5}], "messages[0].name", "must be a string")


@pytest.mark.parametrize("role", ["system", "developer", "user", "tool"])
def test_content_is_required_except_for_assistant_tool_calls(role):
    message = {"role": role, "content": None, **({"tool_call_id": "c"} if role == "tool" else {})}
    rejected([USER, message], "messages[1].content", "required")


def test_content_types():
    rejected([{"role": "user", "content": 5}], "messages[0].content", "a string or an array of content parts, got integer")
    rejected([{"role": "user", "content": {"type": "text"}}], "messages[0].content", "got object")


def test_text_parts_are_joined_for_the_template():
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    request = parse([{"role": "system", "content": parts}, {"role": "user", "content": parts[:1]}])
    assert request.messages[0]["content"] == "first\nsecond"
    assert request.messages[1]["content"] == "first"


def test_bad_content_parts_are_named():
    base = {"type": "text", "text": "ok"}
    rejected([{"role": "user", "content": [base, "x"]}], "messages[0].content[1]", "must be an object")
    rejected([{"role": "user", "content": [base, {"text": "x"}]}], "messages[0].content[1].type", "required")
    rejected([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text", "required")
    rejected([{"role": "user", "content": [{"type": "text", "text": 1}]}], "messages[0].content[0].text", "string")
    rejected([{"role": "user", "content": [{"type": "input_audio"}]}], "messages[0].content[0].type", "input_audio")


def test_images_are_refused_unless_allowed():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}
    content = [{"type": "text", "text": "what is this?"}, image]
    error = rejected([USER, {"role": "user", "content": content}], "messages[1].content[1]")
    assert "images are not supported by this model" in error.message
    allowed = parse([{"role": "user", "content": content}], allow_images=True)
    assert allowed.messages[0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    # Only user messages may carry images, even when images are allowed.
    rejected([{"role": "system", "content": [image]}], "messages[0].content[0]", "images", allow_images=True)


def test_image_parts_are_checked_structurally_first():
    rejected([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0].image_url", "required")
    rejected([{"role": "user", "content": [{"type": "image_url", "image_url": "http://x"}]}],
             "messages[0].content[0].image_url", "must be an object, got string")
    rejected([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
             "messages[0].content[0].image_url.url", "required")



def test_video_parts_as_vllm_sends_them_and_as_frame_lists():
    clip = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    frames = {"type": "video", "video": ["data:image/png;base64,AAAA", "file:///tmp/f.png"]}
    error = rejected([{"role": "user", "content": [clip]}], "messages[0].content[0]")
    assert "videos are not supported by this model" in error.message
    allowed = parse([{"role": "user", "content": [clip, frames, {"type": "text", "text": "what happens?"}]}],
                    allow_images=True)
    assert allowed.messages[0]["content"][:2] == [clip, frames]
    rejected([{"role": "system", "content": [clip]}], "messages[0].content[0]", "videos", allow_images=True)
    rejected([{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x", "fps": 4}}]}],
             "messages[0].content[0].video_url.fps", allow_images=True)  # refused, never silently ignored
    rejected([{"role": "user", "content": [{"type": "video", "video": []}]}], "messages[0].content[0].video",
             "non-empty array", allow_images=True)
    rejected([{"role": "user", "content": [{"type": "video", "video": ["data:,", 3]}]}],
             "messages[0].content[0].video[1]", "string", allow_images=True)

def test_tool_round_trip_messages():
    messages = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "18C", "tool_call_id": "call_1"},
    ]
    request = parse(messages, tools=[TOOL])
    assert request.messages[1] == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert request.messages[2] == {"role": "tool", "content": "18C", "tool_call_id": "call_1"}
    templated = request.template_messages()
    assert templated[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    # The request value itself keeps the arguments exactly as sent.
    assert request.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    templated[0]["content"] = "changed"
    assert request.messages[0]["content"] == "hi"


def test_assistant_content_and_reasoning():
    rejected([USER, {"role": "assistant"}], "messages[1].content", "tool_calls")
    rejected([USER, {"role": "assistant", "content": None, "tool_calls": []}], "messages[1].content", "tool_calls")
    message = {"role": "assistant", "content": "a", "reasoning_content": "thought"}
    assert parse([USER, message]).messages[1] == message
    rejected([USER, {"role": "assistant", "content": "a", "reasoning_content": 1}], "messages[1].reasoning_content")


@pytest.mark.parametrize(
    ("call", "param", "fragment"),
    [
        ("x", "messages[1].tool_calls[0]", "must be an object"),
        ({**CALL, "id": None}, "messages[1].tool_calls[0].id", "required"),
        ({**CALL, "type": "retrieval"}, "messages[1].tool_calls[0].type", "'function'"),
        ({**CALL, "function": "f"}, "messages[1].tool_calls[0].function", "must be an object"),
        ({**CALL, "function": {"arguments": "{}"}}, "messages[1].tool_calls[0].function.name", "required"),
        ({**CALL, "function": {"name": "f"}}, "messages[1].tool_calls[0].function.arguments", "required"),
        ({**CALL, "function": {"name": "f", "arguments": {"a": 1}}}, "messages[1].tool_calls[0].function.arguments", "must be a string"),
        ({**CALL, "function": {"name": "f", "arguments": "{oops"}}, "messages[1].tool_calls[0].function.arguments", "JSON"),
        ({**CALL, "function": {"name": "f", "arguments": "[1, 2]"}}, "messages[1].tool_calls[0].function.arguments", "object"),
    ],
)
def test_bad_tool_calls_are_named(call, param, fragment):
    rejected([USER, {"role": "assistant", "content": None, "tool_calls": [call]}], param, fragment)


def test_tool_messages_need_a_tool_call_id():
    rejected([USER, {"role": "tool", "content": "x"}], "messages[1].tool_call_id", "required")
    rejected([USER, {"role": "tool", "content": "x", "tool_call_id": 3}], "messages[1].tool_call_id", "string")


def test_tools_are_validated_and_normalized():
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}, "strict": True}}
    assert parse([USER], tools=[tool]).tools == (tool,)
    rejected([USER], "tools[0].y", "Unrecognized", tools=[{**tool, "y": 2}])
    rejected([USER], "tools[0].function.x", "Unrecognized", tools=[{**tool, "function": {**tool["function"], "x": 1}}])
    rejected([USER], "tools", "at least one", tools=[])
    rejected([USER], "tools", "must be an array", tools={"type": "function"})
    rejected([USER], "tools[0].type", "'function'", tools=[{"type": "code_interpreter"}])
    rejected([USER], "tools[0].function", "required", tools=[{"type": "function"}])
    rejected([USER], "tools[1].function.name", "required", tools=[TOOL, {"type": "function", "function": {}}])
    rejected([USER], "tools[0].function.parameters", "must be an object", tools=[{**TOOL, "function": {"name": "f", "parameters": "{}"}}])
    rejected([USER], "tools[0].function.description", "string", tools=[{**TOOL, "function": {"name": "f", "description": 1}}])
    rejected([USER], "tools[0].function.strict", "boolean", tools=[{**TOOL, "function": {"name": "f", "strict": "no"}}])


def test_tool_choice():
    assert parse([USER], tools=[TOOL], tool_choice="required").tool_choice == "required"
    assert parse([USER], tool_choice="none").tool_choice == "none"
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert parse([USER], tools=[TOOL], tool_choice=named).tool_choice == named
    rejected([USER], "tool_choice", "bogus", tools=[TOOL], tool_choice="bogus")
    rejected([USER], "tool_choice", "'tools'", tool_choice="required")
    rejected([USER], "tool_choice", "a string or an object, got integer", tools=[TOOL], tool_choice=1)
    rejected([USER], "tool_choice.function.name", "not one of", tools=[TOOL],
             tool_choice={"type": "function", "function": {"name": "other"}})
    rejected([USER], "tool_choice.function.name", "not one of", tool_choice=named)
    rejected([USER], "tool_choice.type", "'function'", tools=[TOOL], tool_choice={"type": "x", "function": {"name": "f"}})
