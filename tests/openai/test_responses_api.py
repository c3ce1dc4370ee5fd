"""The Responses API's sans-IO layer: request bodies -> the chat request, chat choice items -> events."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from kestrel_trio.errors import BadRequestError
from qwen3_choice import qwen3_choice as ChatChoice  # the output read as a Qwen3 model's
from kestrel_trio.openai import responses_api as ra


def parse(**body) -> ra.ResponsesRequest:
    return ra.parse_responses_request(json.dumps({"model": "m", **body}).encode())


def refused(**body) -> BadRequestError:
    with pytest.raises(BadRequestError) as caught:
        parse(**body)
    return caught.value


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    req = parse(input="Hi", instructions="Be terse.", max_output_tokens=9, temperature=0.5, top_p=0.9, stream=True)
    assert req.chat.messages == ({"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"})
    sampling = req.chat.sampling
    assert (sampling.max_tokens, sampling.max_tokens_param, sampling.temperature, sampling.top_p, sampling.stream) == \
        (9, "max_output_tokens", 0.5, 0.9, True)
    assert req.thinking is None and req.chat.tools is None and req.chat.structured is None
    assert req.echo["instructions"] == "Be terse." and req.echo["tool_choice"] == "auto"


IMAGE = "data:image/png;base64,AA"


def test_items_fold_into_chat_turns() -> None:
    req = parse(input=[
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Look"},
                                                         {"type": "input_image", "image_url": IMAGE, "detail": "low"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}]},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Yes."}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}', "id": "fc_1"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
    ])
    assert req.chat.messages == (
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": [{"type": "text", "text": "Look"},
                                     {"type": "image_url", "image_url": {"url": IMAGE}}]},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Hm.\nYes.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    )


def test_a_chat_path_maps_back_to_the_field_sent() -> None:
    req = parse(instructions="Rules.", input=[
        {"role": "user", "content": "a"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "b"},
        {"role": "user", "content": [{"type": "input_text", "text": "c"},
                                     {"type": "input_image", "image_url": IMAGE}]}])
    assert req.origins == ("instructions", "input[0]", "input[1]", "input[2]", "input[3]")
    assert req.input_path("messages[4].content[1]") == "input[3].content[1]"
    assert req.input_path("messages") == "input" and req.input_path("max_tokens") == "max_tokens"
    assert parse(input="a").input_path("messages[0].content") == "input.content"


def test_counting_input_tokens_takes_the_prompts_fields_only() -> None:
    body = {"input": "Hi", "instructions": "Rules.", "reasoning": {"effort": "none"}}
    req = ra.parse_input_tokens_request(json.dumps(body).encode())
    assert req.chat.model is None and req.thinking is False and len(req.chat.messages) == 2
    with pytest.raises(BadRequestError, match="Unrecognized request argument supplied: 'max_output_tokens'"):
        ra.parse_input_tokens_request(json.dumps({**body, "max_output_tokens": 5}).encode())
    with pytest.raises(BadRequestError, match="stateless"):
        ra.parse_input_tokens_request(json.dumps({**body, "previous_response_id": "resp_1"}).encode())


def test_function_tools_tool_choice_and_formats_become_the_chat_forms() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    req = parse(input="Hi", tools=[{"type": "function", "name": "f", "parameters": schema, "strict": True}],
                tool_choice={"type": "function", "name": "f"}, parallel_tool_calls=False,
                text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}})
    assert req.chat.tools == ({"type": "function", "function": {"name": "f", "parameters": schema}},)
    assert req.chat.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert req.chat.parallel_tool_calls is False
    assert (req.chat.structured.kind, req.chat.structured.param, req.chat.structured.schema) == \
        ("json_schema", "text.format.schema", schema)
    assert req.echo["tool_choice"] == {"type": "function", "name": "f"}
    assert req.echo["tools"][0]["strict"] is True
    assert parse(input="Hi", text={"format": {"type": "json_object"}}).chat.structured.kind == "json_object"
    assert parse(input="Hi", text={"format": {"type": "text"}}).chat.structured is None


@pytest.mark.parametrize(("effort", "thinking"), [("none", False), ("minimal", False), ("low", True),
                                                  ("medium", True), ("high", True), ("xhigh", True),
                                                  ("max", True)])
def test_reasoning_effort_is_the_thinking_switch(effort: str, thinking: bool) -> None:
    assert parse(input="Hi", reasoning={"effort": effort, "summary": "auto"}).thinking is thinking


def test_a_codex_shaped_request_is_accepted() -> None:
    """The body Codex sends (codex-rs ResponsesApiRequest): no-ops for what a local stateless server lacks."""
    req = parse(instructions="You are Codex.", input=[
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}],
         "content": None, "encrypted_content": None},
        {"type": "function_call", "name": "shell", "arguments": '{"command": ["ls"]}', "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
    ], tools=[{"type": "function", "name": "shell", "description": "Runs a command", "strict": False,
               "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}],
        tool_choice="auto", parallel_tool_calls=False, reasoning={"effort": "medium", "summary": "auto"},
        store=False, stream=True, include=["reasoning.encrypted_content"], prompt_cache_key="thread-1",
        text={"verbosity": "medium"})
    assert [message["role"] for message in req.chat.messages] == ["system", "system", "user", "assistant", "tool"]
    assert req.thinking is True and req.chat.sampling.stream


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
    ({"conversation": {"id": "conv_1"}}, "conversation", "stateless"),
    ({"frobnicate": 1}, "frobnicate", "Unrecognized request argument supplied: 'frobnicate'"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "extra": 1}}}, "text.format.extra",
     "Unrecognized"),
    ({"text": {"verbosity": "high"}}, "text.verbosity", "medium"),
    ({"background": True}, "background", "false"),
    ({"include": ["message.output_text.logprobs"]}, "include[0]", "not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "hosted tools"),
    ({"tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]}, "tools[1].name", "unique"),
    ({"tool_choice": "required"}, "tool_choice", "no 'tools'"),
    ({"tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice.type", "not supported"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "must be one of"),
    ({"max_output_tokens": 0}, "max_output_tokens", "at least 1"),
    ({"metadata": {"k": 1}}, "metadata.k", "a string"),
    ({"top_logprobs": 3}, "top_logprobs", "not supported"),
])
def test_refusals_name_the_field(body: dict, param: str, words: str) -> None:
    error = refused(input="Hi", **body)
    assert error.param == param and words in error.message


@pytest.mark.parametrize(("items", "param", "words"), [
    ([{"type": "item_reference", "id": "msg_1"}], "input[0].type", "stateless"),
    ([{"role": "tool", "content": "x"}], "input[0].role", "must be one of"),
    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input[0].content[0].type",
     "input_text or input_image"),
    ([{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}], "input[0].content[0].file_id",
     "uploaded files"),
    ([{"role": "user", "content": "x"}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}],
     "input[1].arguments", "JSON-encoded object"),
    ([{"role": "user", "content": "x"}, {"type": "reasoning", "content": []}], "input[1]", "must be followed"),
    ([{"role": "assistant", "content": "x"}], "input", "a user message"),
    ([{"role": "user", "content": "x", "name": "bob"}], "input[0].name", "Unrecognized"),
    ([], "input", "at least one item"),
])
def test_bad_input_items_are_refused_by_path(items: list, param: str, words: str) -> None:
    error = refused(input=items)
    assert error.param == param and words in error.message


def run(texts: list[str], finish_reason: str = "stop", **choice) -> tuple[list[dict], dict]:
    ids = (f"call_{i}" for i in itertools.count())
    chat = ChatChoice(0, make_id=lambda: next(ids), **choice)
    assembler = ra.ResponseAssembler("resp_1", "m", 1700000000, {"metadata": {}}, 5)
    events = assembler.start()
    for count, text in enumerate(texts, 1):
        events += assembler.push(chat.push(text), count)
    events += assembler.push(chat.finish(finish_reason), len(texts))
    events += assembler.finish(chat.finish_reason, len(texts), cached_tokens=2)
    return events, assembler.response()


def test_function_call_arguments_stream_as_they_are_decoded() -> None:
    """Each text delta's argument piece is its own delta event, sent in the push of that text."""
    ids = (f"call_{i}" for i in itertools.count())
    chat = ChatChoice(0, make_id=lambda: next(ids), parse_tools=True)
    echo = parse(input="Hi", tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}]).echo
    assembler = ra.ResponseAssembler("resp_1", "m", 1700000000, echo, 5)
    assembler.start()
    texts = ["<tool_call>\n", '{"name": "f", "arguments": ', '{"a"', ": 1, ", '"b": [2]', "}}", "\n</tool_call>"]
    pushed = [assembler.push(chat.push(text), count) for count, text in enumerate(texts, 1)]
    pieces = [[e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
              for events in pushed]
    assert pieces == [[], [], ['{"a"'], [": 1, "], ['"b": [2]'], ["}"], []]
    # The item opens once the name and the arguments' brace are read, with the first piece.
    assert [e["type"] for e in pushed[2]] == ["response.output_item.added", "response.function_call_arguments.delta"]
    tail = assembler.push(chat.finish("stop"), len(texts)) + assembler.finish(chat.finish_reason, len(texts))
    [done] = [e for e in tail if e["type"] == "response.function_call_arguments.done"]
    assert done["arguments"] == '{"a": 1, "b": [2]}' == assembler.response()["output"][0]["arguments"]
    for event in [event for events in pushed for event in events] + tail:  # the SDK's spec-generated models
        pydantic.TypeAdapter(ResponseStreamEvent).validate_python(event)


def test_text_then_a_function_call_and_the_response_is_the_last_events() -> None:
    events, response = run(["Let me ", "check.", "<tool_call>\n", '{"name": "f", "arguments": {"a": 1}}',
                            "\n</tool_call>"], parse_tools=True)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    call = events[-2]["item"]
    assert {key: call[key] for key in ("type", "call_id", "name", "arguments", "status")} == \
        {"type": "function_call", "call_id": "call_0", "name": "f", "arguments": '{"a": 1}', "status": "completed"}
    assert events[-1]["response"] is response and response["status"] == "completed"
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    assert response["output"][0]["content"][0]["text"] == "Let me check."
    assert response["usage"] == {"input_tokens": 5,
                                 "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
                                 "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                                 "total_tokens": 10}


def test_reasoning_tokens_count_up_to_the_end_of_the_reasoning() -> None:
    events, response = run(["Hm", ", yes.", "</think>", "\n\nHi", "!"], reasoning=True, starts_in_reasoning=True)
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
    assert response["output"][0]["content"] == [{"type": "reasoning_text", "text": "Hm, yes."}]
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == 2


def test_a_cut_answer_is_incomplete_and_a_failure_ends_with_response_failed() -> None:
    events, response = run(["Hel", "lo"], finish_reason="length")
    assert events[-1]["type"] == "response.incomplete" and response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"
    assembler = ra.ResponseAssembler("resp_2", "m", 0, {}, 3)
    events = assembler.start() + assembler.push([{"delta": {"content": "Hi"}}], 1) + assembler.fail("boom")
    assert [event["type"] for event in events][-3:] == ["response.output_item.done", "error", "response.failed"]
    assert events[-2] == {"type": "error", "sequence_number": events[-2]["sequence_number"], "code": "server_error",
                          "message": "boom", "param": None}
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "boom"}


def test_events_are_framed_with_their_type() -> None:
    assert ra.sse_event({"type": "response.created", "sequence_number": 0}) == \
        b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'


def test_the_docs_list_every_no_op_and_refused_field() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "responses.md").read_text()
    for field, (accepts, why, _check) in ra.NO_OP_FIELDS.items():
        assert f"| `{field}` | {accepts} | {why} |" in page, field
    for field, why in ra.REFUSED_FIELDS.items():
        assert f"| `{field}` | {why} |" in page, field


def test_every_event_and_response_validates_against_the_sdks_models() -> None:
    """The openai SDK's pydantic models are generated from OpenAI's OpenAPI spec: validated, not constructed."""
    events_of = pydantic.TypeAdapter(ResponseStreamEvent)
    req = parse(input="Hi", tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                reasoning={"effort": "high"}, metadata={"k": "v"},
                text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}})
    chat = ChatChoice(0, reasoning=True, starts_in_reasoning=True, parse_tools=True)
    assembler = ra.ResponseAssembler("resp_1", "m", 1700000000, req.echo, 5)
    events = assembler.start()
    for text in ["Hm.", "</think>", "Hi ", "<tool_call>\n", '{"name": "f", "arguments": {"a": 1}}', "\n</tool_call>"]:
        events += assembler.push(chat.push(text), 1)
    events += assembler.push(chat.finish("stop"), 6) + assembler.finish(chat.finish_reason, 6)
    cut = ra.ResponseAssembler("resp_2", "m", 0, req.echo, 5)
    events += cut.start() + cut.push([{"delta": {"content": "x"}}], 1) + cut.finish("length", 1)
    failed = ra.ResponseAssembler("resp_3", "m", 0, req.echo, 5)
    events += failed.start() + failed.push([{"delta": {"content": "x"}}], 1) + failed.fail("boom")
    kinds = {events_of.validate_python(event).type for event in events}
    assert {"response.reasoning_text.delta", "response.function_call_arguments.done", "response.incomplete",
            "error", "response.failed"} <= kinds
    for response in (assembler.response(), cut.response()):
        Response.model_validate(response)
