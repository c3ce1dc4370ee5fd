"""The official openai client's Responses API (``client.responses``) against the server, on the demo model.

Random weights never write what a test needs, so the answers are scripted as in test_anthropic_client.py: the
real forward pass runs, then the scripted next token is made to win by a wide logit margin before the real
sampler (and any grammar) sees the logits. Everything downstream (sampling, detokenization, the engine, the
routes, HTTP, the event stream, the SDK's own stream accumulator) is the real code. The client is synchronous:
it runs in a worker thread while the server runs in the test's trio loop.
"""

from __future__ import annotations

import json
from typing import Literal

import openai
import pydantic
import pytest
import trio
from openai.types.responses import ResponseStreamEvent

from kestrel_trio.model import Model
from kestrel_trio.server import Server
from kestrel_trio.text.generation import Generation

from server_kit import ScriptedModel, client_for, fetch, in_worker, running_server
from slow_host import allowance

HELLO = "Hello there, traveller!"
THOUGHT = "The user greets me."
ANSWER = "It is 18 degrees and clear in Oslo."
FORM = '{"city": "Oslo", "degrees": 18}'
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": True,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                         "additionalProperties": False}}]
FORCED = {"type": "function", "name": "get_weather"}
IMAGE = "data:image/png;base64,AA"


class Weather(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    city: Literal["Oslo", "Bergen"]
    degrees: int = pydantic.Field(ge=-5, le=30)


def script(prompt: str) -> str:
    """What the scripted model answers to a rendered prompt."""
    if "<tool_response>" in prompt:
        return ANSWER
    if prompt.endswith('"arguments": '):  # tool_choice named the function
        return '{"city": "Oslo"}}\n</tool_call>'
    if "Fill in the form." in prompt:
        return FORM
    if prompt.endswith("<|im_start|>assistant\n"):  # thinking left to the model (enable_thinking true)
        return f"<think>\n{THOUGHT}\n</think>\n\n{HELLO}"
    return HELLO


@pytest.fixture
def scripted(demo_model: Model, monkeypatch: pytest.MonkeyPatch) -> Model:
    return ScriptedModel(demo_model, script).install(monkeypatch).model


async def with_client(server: Server, work):
    """``work(client, model_id)`` in a worker thread, with an openai client pointed at ``server``."""
    return await in_worker(lambda: client_for(server), work, server.state.model_id)


def raw_events(body: bytes) -> list[dict]:
    """The events of a raw Responses stream, each ``event:`` line checked against its data's ``type``."""
    events = []
    for frame in body.decode().split("\n\n")[:-1]:
        name_line, data_line = frame.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {data['type']}"
        events.append(data)
    return events


async def test_a_response_whole_and_streamed_agree(scripted) -> None:
    request = dict(input="Say hello.", instructions="You are terse.", reasoning={"effort": "none"},
                   metadata={"run": "r-1"}, user="u-1", temperature=0.0, top_p=1.0, max_output_tokens=64)
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            def work(client, model_id):
                full = client.responses.create(model=model_id, **request)
                with client.responses.stream(model=model_id, **request) as stream:
                    events = [event.type for event in stream]
                    final = stream.get_final_response()
                counted = client.responses.input_tokens.count(model=model_id, input="Say hello.",
                                                              instructions="You are terse.",
                                                              reasoning={"effort": "none"})
                return full, events, final, counted

            full, events, final, counted = await with_client(server, work)
    assert full.object == "response" and full.id.startswith("resp_") and full.status == "completed"
    assert full.created_at <= full.completed_at and final.completed_at is not None
    assert full.output_text == final.output_text == HELLO
    assert [item.type for item in full.output] == [item.type for item in final.output] == ["message"]
    assert full.metadata == {"run": "r-1"} and full.user == "u-1" and full.instructions == "You are terse."
    assert full.store is False and full.max_output_tokens == 64 and full.reasoning.effort == "none"
    assert (full.temperature, full.top_p) == (0.0, 1.0)
    usage = full.usage
    assert usage.output_tokens == final.usage.output_tokens == len(scripted.encode(HELLO)) + 1  # + EOS
    assert usage.input_tokens == final.usage.input_tokens == counted.input_tokens > 0
    assert counted.object == "response.input_tokens"
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert events[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                          "response.content_part.added"]
    assert set(events[4:-4]) == {"response.output_text.delta"}
    assert events[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                           "response.completed"]


async def test_the_event_sequence_of_a_streamed_answer_with_reasoning(scripted) -> None:
    """Golden: the raw events off the socket, consecutive deltas of an item folded into one."""
    body = {"model": None, "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
            "reasoning": {"effort": "high", "summary": "auto"}, "stream": True, "store": True}
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            body["model"] = server.state.model_id
            response = await fetch(server.port, "POST", "/v1/responses", body)
            card = (await fetch(server.port, "GET", f"/v1/models/{server.state.model_id}")).json()
    assert response.status == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = raw_events(response.body)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    for event in events:  # the SDK's models are generated from OpenAI's OpenAPI spec: validated, not constructed
        pydantic.TypeAdapter(ResponseStreamEvent).validate_python(event)
    folded: list = []
    for event in events:
        event = {key: value for key, value in event.items() if key not in ("sequence_number", "item_id")}
        if event["type"].endswith(".delta") and folded and folded[-1]["type"] == event["type"]:
            folded[-1]["delta"] += event["delta"]
            continue
        folded.append(event)
    created, in_progress, *middle, completed = folded
    assert created["response"]["status"] == in_progress["response"]["status"] == "in_progress"
    assert created["response"]["output"] == []
    reasoning = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": THOUGHT + "\n"}],
                 "status": "completed"}
    text = {"type": "output_text", "text": HELLO, "annotations": [], "logprobs": []}
    message = {"type": "message", "role": "assistant", "status": "completed", "content": [text]}
    for event in middle:
        if "item" in event:
            event["item"].pop("id")
    assert middle == [
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"type": "reasoning", "summary": [], "content": [], "status": "in_progress"}},
        {"type": "response.content_part.added", "output_index": 0, "content_index": 0,
         "part": {"type": "reasoning_text", "text": ""}},
        {"type": "response.reasoning_text.delta", "output_index": 0, "content_index": 0, "delta": THOUGHT + "\n"},
        {"type": "response.reasoning_text.done", "output_index": 0, "content_index": 0, "text": THOUGHT + "\n"},
        {"type": "response.content_part.done", "output_index": 0, "content_index": 0,
         "part": reasoning["content"][0]},
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        {"type": "response.output_item.added", "output_index": 1,
         "item": {"type": "message", "role": "assistant", "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", "output_index": 1, "content_index": 0,
         "part": {**text, "text": ""}},
        {"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": HELLO,
         "logprobs": []},
        {"type": "response.output_text.done", "output_index": 1, "content_index": 0, "text": HELLO,
         "logprobs": []},
        {"type": "response.content_part.done", "output_index": 1, "content_index": 0, "part": text},
        {"type": "response.output_item.done", "output_index": 1, "item": message},
    ]
    assert completed["type"] == "response.completed"
    final = completed["response"]
    assert final["status"] == "completed" and final["store"] is False
    defaults = card["sampling_defaults"]  # nothing sent: the sampling the request got is reported
    assert (final["temperature"], final["top_p"]) == (defaults["temperature"], defaults["top_p"])
    assert [{k: v for k, v in item.items() if k != "id"} for item in final["output"]] == [reasoning, message]
    output_tokens = len(scripted.encode(f"<think>\n{THOUGHT}\n</think>\n\n{HELLO}")) + 1
    assert final["usage"]["output_tokens"] == output_tokens
    assert 0 < final["usage"]["output_tokens_details"]["reasoning_tokens"] < output_tokens


async def test_a_forced_function_call_and_its_output_round_trip(scripted) -> None:
    question = [{"role": "user", "content": "Weather in Oslo?"}]
    with trio.fail_after(allowance(120)):
        async with running_server(scripted) as server:
            def work(client, model_id):
                call = client.responses.create(model=model_id, input=question, tools=TOOLS, tool_choice=FORCED)
                with client.responses.stream(model=model_id, input=question, tools=TOOLS,
                                             tool_choice=FORCED) as stream:
                    deltas = [event.delta for event in stream if event.type == "response.function_call_arguments.delta"]
                    streamed = stream.get_final_response()
                [item] = call.output
                turns = [*question, item.model_dump(exclude_none=True),
                         {"type": "function_call_output", "call_id": item.call_id, "output": "18 degrees, clear"}]
                answer = client.responses.create(model=model_id, input=turns, tools=TOOLS, parallel_tool_calls=False)
                return call, deltas, streamed, answer

            call, deltas, streamed, answer = await with_client(server, work)
    [item] = call.output
    assert item.type == "function_call" and item.name == "get_weather" and item.status == "completed"
    assert json.loads(item.arguments) == {"city": "Oslo"} and item.call_id.startswith("call_")
    assert call.tool_choice.name == "get_weather" and call.tools[0].name == "get_weather"
    [streamed_item] = streamed.output
    assert streamed_item.type == "function_call" and json.loads(streamed_item.arguments) == {"city": "Oslo"}
    assert "".join(deltas) == streamed_item.arguments
    assert len(deltas) > 1  # the arguments stream as they are decoded (the script sends a token a step)
    assert answer.output_text == ANSWER and answer.status == "completed" and answer.parallel_tool_calls is False


async def test_a_json_schema_format_holds_the_answer_to_the_schema(scripted) -> None:
    schema = Weather.model_json_schema()
    text = {"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}}
    form = [{"role": "user", "content": "Fill in the form."}]
    with trio.fail_after(allowance(120)):
        async with running_server(scripted) as server:
            def work(client, model_id):
                whole = client.responses.create(model=model_id, input=form, text=text, max_output_tokens=48)
                parsed = client.responses.parse(model=model_id, input=form, text_format=Weather, max_output_tokens=48)
                plain = client.responses.create(model=model_id, input=form, max_output_tokens=48,
                                                text={"format": {"type": "json_object"}})
                return whole, parsed, plain

            whole, parsed, plain = await with_client(server, work)
    assert Weather.model_validate_json(whole.output_text) == Weather(city="Oslo", degrees=18)
    assert whole.text.format.type == "json_schema" and whole.text.format.name == "weather"
    assert parsed.output_parsed == Weather(city="Oslo", degrees=18)
    assert isinstance(json.loads(plain.output_text), dict)


async def test_a_capped_answer_is_incomplete(scripted) -> None:
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            def work(client, model_id):
                whole = client.responses.create(model=model_id, input="Say hello.", max_output_tokens=2,
                                                reasoning={"effort": "none"})
                with client.responses.stream(model=model_id, input="Say hello.", max_output_tokens=2,
                                             reasoning={"effort": "none"}) as stream:
                    events = [event.type for event in stream]
                return whole, events

            whole, events = await with_client(server, work)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 2 and whole.output[0].status == "incomplete"
    assert events[-1] == "response.incomplete"


async def test_refusals_come_in_openais_envelope_through_the_clients_exceptions(scripted) -> None:
    context = scripted.context_length
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            def work(client, model_id):
                caught = {}
                attempts = {
                    "previous": dict(model=model_id, input="hi", previous_response_id="resp_123"),
                    "conversation": dict(model=model_id, input="hi", conversation="conv_123"),
                    "field": dict(model=model_id, input="hi", extra_body={"frobnicate": 1}),
                    "hosted": dict(model=model_id, input="hi", tools=[{"type": "web_search"}]),
                    "model": dict(model="gpt-5", input="hi"),
                    "effort": dict(model=model_id, input="hi", reasoning={"effort": "extreme"}),
                    "role": dict(model=model_id, input=[{"role": "tool", "content": "hi"}]),
                    "long": dict(model=model_id, input="hi " * (context + 8)),
                    "room": dict(model=model_id, input="hi", max_output_tokens=context),
                    "image": dict(model=model_id, instructions="Look.", input=[
                        {"role": "user", "content": "hi"},
                        {"role": "user", "content": [{"type": "input_text", "text": "See:"},
                                                     {"type": "input_image", "image_url": IMAGE}]}]),
                }
                for name, request in attempts.items():
                    try:
                        client.responses.create(**request)
                    except openai.APIStatusError as exc:
                        caught[name] = exc
                try:
                    client.responses.retrieve("resp_123")
                except openai.APIStatusError as exc:
                    caught["retrieve"] = exc
                return caught

            caught = await with_client(server, work)
    assert set(caught) == {"previous", "conversation", "field", "hosted", "model", "effort", "role", "long", "room",
                           "image", "retrieve"}
    for name, exc in caught.items():
        expected = openai.NotFoundError if name in ("model", "retrieve") else openai.BadRequestError
        assert isinstance(exc, expected), name
        assert set(exc.body) == {"message", "type", "param", "code"}  # the SDK unwraps {"error": {...}}
    assert caught["previous"].body["param"] == "previous_response_id"
    assert "stateless" in caught["previous"].body["message"] and "stateless" in caught["conversation"].body["message"]
    assert caught["field"].body["message"] == "Unrecognized request argument supplied: 'frobnicate'"
    assert caught["hosted"].body["param"] == "tools[0].type" and "web_search" in caught["hosted"].body["message"]
    assert "gpt-5" in caught["model"].body["message"]
    assert caught["effort"].body["param"] == "reasoning.effort"
    assert caught["role"].body["param"] == "input[0].role"
    assert "stores no responses" in caught["retrieve"].body["message"]
    for name in ("long", "room"):
        assert caught[name].body["code"] == "context_length_exceeded", caught[name].body
    assert caught["long"].body["param"] == "input" and "context length" in caught["long"].body["message"]
    assert "max_output_tokens" in caught["room"].body["message"], caught["room"].body
    image = caught["image"].body  # named by the Responses field sent, not the chat request's messages[2]
    assert image["param"] == "input[1].content[1].image_url" and image["message"].startswith(f"'{image['param']}'")


async def test_the_routers_refusals_on_the_responses_path(demo_model: Model) -> None:
    with trio.fail_after(allowance(60)):
        async with running_server(demo_model) as server:
            plain = await fetch(server.port, "POST", "/v1/responses", {}, content_type="text/plain")
            method = await fetch(server.port, "GET", "/v1/responses")
            deleted = await fetch(server.port, "DELETE", "/v1/responses/resp_1")
            missing = await fetch(server.port, "POST", "/v1/responses", {"model": server.state.model_id})
    assert plain.status == 415 and method.status == 405
    assert deleted.status == 404 and "stores no responses" in deleted.json()["error"]["message"]
    assert missing.status == 400 and missing.json()["error"]["param"] == "input"


async def test_a_codex_shaped_conversation_is_answered(scripted) -> None:
    """The body Codex sends after a tool call (codex-rs ResponsesApiRequest), raw off the socket."""
    body = {"model": None, "instructions": "You are a coding agent.", "stream": True, "store": False,
            "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1", "text": {"verbosity": "medium"},
            "tools": [{"type": "function", "name": "get_weather", "description": "The weather in a city",
                       "strict": False, "parameters": TOOLS[0]["parameters"]}],
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be careful."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text",
                                                                                "text": "Call the tool."}],
                 "encrypted_content": None},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                 "arguments": '{"city": "Oslo"}', "status": "completed"},
                {"type": "function_call_output", "call_id": "call_1", "output": "18 degrees, clear"}]}
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            body["model"] = server.state.model_id
            response = await fetch(server.port, "POST", "/v1/responses", body)
    assert response.status == 200, response.body
    events = raw_events(response.body)
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and final["output"][-1]["content"][0]["text"] == ANSWER


async def test_a_failure_mid_stream_ends_with_error_and_response_failed(scripted, monkeypatch) -> None:
    """A generation that fails after its first tokens (here: out of memory in sampling) ends the event stream."""
    scripted_advance = Generation.advance

    def advance(generation: Generation, logits):
        if len(generation.generated_ids) == 3:
            raise MemoryError("no room for the sampler")
        return scripted_advance(generation, logits)

    monkeypatch.setattr(Generation, "advance", advance)
    body = {"model": None, "input": "Say hello.", "reasoning": {"effort": "none"}, "stream": True}
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            body["model"] = server.state.model_id
            response = await fetch(server.port, "POST", "/v1/responses", body)
    assert response.status == 200
    events = raw_events(response.body)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events][-3:] == ["response.output_item.done", "error", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert failed["error"]["message"] == events[-2]["message"] and "memory" in events[-2]["message"]
    assert failed["output"][0]["status"] == "incomplete" and failed["output"][0]["content"][0]["text"]
