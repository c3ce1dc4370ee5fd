"""The official anthropic client against the server's Messages API, on the demo model.

Random weights never write what a test needs, so the answers are scripted as in test_tools.py: the real
forward pass runs, then the scripted next token is made to win by a wide logit margin before the real
sampler sees the logits. Everything downstream (sampling, detokenization, the engine, the routes, HTTP,
the event stream) is the real code. The client is synchronous: it runs in a worker thread while the
server runs in the test's trio loop.
"""

from __future__ import annotations

import json

import anthropic
import pytest
import trio

from kestrel_trio.model import Model
from kestrel_trio.server import Server

from server_kit import HOST, ScriptedModel, fetch, in_worker, running_server
from slow_host import allowance

KEY = "sk-test-anthropic"
HELLO = "Hello there, traveller!"
THOUGHT = "The user greets me."
ANSWER = "It is 18 degrees and clear in Oslo."
TOOLS = [{"name": "get_weather", "description": "The weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
QUESTION = [{"role": "user", "content": "Weather in Oslo?"}]
GREETING = [{"role": "user", "content": "Say hello."}]


def script(prompt: str) -> str:
    """What the scripted model answers to a rendered prompt."""
    if "<tool_response>" in prompt:
        return ANSWER
    if prompt.endswith('"arguments": '):  # tool_choice named the function
        return '{"city": "Oslo"}}\n</tool_call>'
    if prompt.endswith("<|im_start|>assistant\n"):  # thinking left to the model (enable_thinking true)
        return f"<think>\n{THOUGHT}\n</think>\n\n{HELLO}"
    return HELLO


@pytest.fixture
def scripted(demo_model: Model, monkeypatch: pytest.MonkeyPatch) -> Model:
    return ScriptedModel(demo_model, script).install(monkeypatch).model


async def with_client(server: Server, work, api_key: str = "unused"):
    """``work(client, model_id)`` in a worker thread, with a client pointed at ``server``."""
    return await in_worker(lambda: anthropic.Anthropic(base_url=f"http://{HOST}:{server.port}", api_key=api_key,
                                                       max_retries=0, timeout=allowance(30)),
                           work, server.state.model_id)


def texts(message) -> tuple[str, str]:
    """(thinking, text) of a message's content blocks."""
    thinking = "".join(block.thinking for block in message.content if block.type == "thinking")
    return thinking, "".join(block.text for block in message.content if block.type == "text")


async def test_a_message_whole_and_streamed_agree_and_usage_matches_count_tokens(scripted) -> None:
    request = dict(messages=GREETING, max_tokens=64, system="You are terse.", thinking={"type": "disabled"},
                   metadata={"user_id": "u-1"}, extra_body={"temperature": 0.0, "top_k": 1, "top_p": 1.0})
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            def work(client, model_id):
                full = client.messages.create(model=model_id, **request)
                with client.messages.stream(model=model_id, **request) as stream:
                    events = [event.type for event in stream]
                    final = stream.get_final_message()
                counted = client.messages.count_tokens(model=model_id, messages=GREETING, system="You are terse.",
                                                       thinking={"type": "disabled"})
                return full, events, final, counted

            full, events, final, counted = await with_client(server, work)
    assert full.type == "message" and full.role == "assistant" and full.id.startswith("msg_")
    assert texts(full) == ("", HELLO) and [block.type for block in full.content] == ["text"]
    assert full.stop_reason == "end_turn" and full.stop_sequence is None
    assert texts(final) == texts(full) and final.stop_reason == "end_turn"
    assert full.usage.input_tokens == final.usage.input_tokens == counted.input_tokens > 0
    assert full.usage.output_tokens == final.usage.output_tokens == len(scripted.encode(HELLO)) + 1  # + EOS
    assert events[:2] == ["message_start", "content_block_start"]  # the SDK's own event types (it drops pings)
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]


async def test_the_event_sequence_of_a_streamed_answer_with_thinking_is_anthropics(scripted) -> None:
    """Golden: the raw events off the socket, consecutive deltas of a block folded into one."""
    body = {"model": None, "max_tokens": 2048, "messages": GREETING, "stream": True,
            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            body["model"] = server.state.model_id
            response = await fetch(server.port, "POST", "/v1/messages", body,
                                   headers=(("anthropic-version", "2023-06-01"),))
    assert response.status == 200 and response.headers["content-type"].startswith("text/event-stream")
    folded: list = []
    for event in response.body.decode().split("\n\n")[:-1]:
        name_line, data_line = event.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        if name == "content_block_delta" and folded and folded[-1][0] == name:
            kind = data["delta"]["type"]
            key = {"text_delta": "text", "thinking_delta": "thinking"}[kind]
            folded[-1][1]["delta"][key] += data["delta"][key]
            continue
        folded.append((name, data))
    message_start = folded[0][1]["message"]
    assert message_start["content"] == [] and message_start["usage"]["output_tokens"] == 0
    assert message_start["stop_reason"] is None and message_start["usage"]["input_tokens"] > 0
    output_tokens = len(scripted.encode(f"<think>\n{THOUGHT}\n</think>\n\n{HELLO}")) + 1
    assert folded[1:] == [
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ("ping", {"type": "ping"}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "thinking_delta", "thinking": THOUGHT + "\n"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                 "delta": {"type": "text_delta", "text": HELLO}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": output_tokens}}),
        ("message_stop", {"type": "message_stop"}),
    ]


async def test_a_forced_tool_call_and_its_result_round_trip(scripted) -> None:
    with trio.fail_after(allowance(120)):
        async with running_server(scripted) as server:
            def work(client, model_id):
                call = client.messages.create(model=model_id, max_tokens=64, messages=QUESTION, tools=TOOLS,
                                              tool_choice={"type": "tool", "name": "get_weather"})
                with client.messages.stream(model=model_id, max_tokens=64, messages=QUESTION, tools=TOOLS,
                                            tool_choice={"type": "tool", "name": "get_weather"}) as stream:
                    deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
                    streamed = stream.get_final_message()
                [use] = call.content
                turns = [*QUESTION, {"role": "assistant", "content": call.content},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                       "content": "18 degrees, clear"}]}]
                answer = client.messages.create(model=model_id, max_tokens=64, messages=turns, tools=TOOLS)
                return call, deltas, streamed, answer

            call, deltas, streamed, answer = await with_client(server, work)
    [use] = call.content
    assert call.stop_reason == "tool_use" and use.type == "tool_use" and use.name == "get_weather"
    assert use.input == {"city": "Oslo"} and use.id.startswith("toolu_")
    [streamed_use] = streamed.content
    assert streamed.stop_reason == "tool_use" and streamed_use.input == {"city": "Oslo"}
    assert deltas and set(deltas) == {"input_json_delta"}
    assert answer.stop_reason == "end_turn" and texts(answer) == ("", ANSWER)


async def test_a_stop_sequence_ends_the_answer_and_is_named(scripted) -> None:
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            def work(client, model_id):
                request = dict(model=model_id, max_tokens=64, messages=GREETING, stop_sequences=["zzz", "there"],
                               thinking={"type": "disabled"})
                full = client.messages.create(**request)
                with client.messages.stream(**request) as stream:
                    streamed = stream.get_final_message()
                capped = client.messages.create(model=model_id, max_tokens=2, messages=GREETING,
                                                thinking={"type": "disabled"})
                return full, streamed, capped

            full, streamed, capped = await with_client(server, work)
    for message in (full, streamed):
        assert (message.stop_reason, message.stop_sequence, texts(message)) == ("stop_sequence", "there",
                                                                                ("", "Hello "))
    assert capped.stop_reason == "max_tokens" and capped.usage.output_tokens == 2


async def test_refusals_come_in_anthropics_envelope_through_the_clients_exceptions(scripted) -> None:
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            def work(client, model_id):
                caught = {}
                attempts = {
                    "max_tokens": dict(model=model_id, messages=GREETING, max_tokens=anthropic.NOT_GIVEN),
                    "role": dict(model=model_id, max_tokens=8, messages=[{"role": "tool", "content": "hi"}]),
                    "model": dict(model="claude-sonnet-4-5", max_tokens=8, messages=GREETING),
                    "field": dict(model=model_id, max_tokens=8, messages=GREETING, extra_body={"frobnicate": 1}),
                    "budget": dict(model=model_id, max_tokens=8, messages=GREETING,
                                   thinking={"type": "enabled", "budget_tokens": 1024}),
                }
                for name, request in attempts.items():
                    try:
                        client.messages.create(**request)
                    except anthropic.APIStatusError as exc:
                        caught[name] = exc
                try:
                    client.messages.count_tokens(model=model_id, messages=[])
                except anthropic.APIStatusError as exc:
                    caught["empty"] = exc
                return caught

            caught = await with_client(server, work)
    assert set(caught) == {"max_tokens", "role", "model", "field", "budget", "empty"}
    for name, exc in caught.items():
        expected = anthropic.NotFoundError if name == "model" else anthropic.BadRequestError
        assert isinstance(exc, expected), name
        assert exc.body["type"] == "error" and set(exc.body["error"]) == {"type", "message"}
        assert exc.body["error"]["type"] == ("not_found_error" if name == "model" else "invalid_request_error")
    assert "max_tokens" in caught["max_tokens"].body["error"]["message"]
    assert "'messages[0].role' must be 'user', 'assistant' or 'system'" in caught["role"].body["error"]["message"]
    assert "claude-sonnet-4-5" in caught["model"].body["error"]["message"]
    assert caught["field"].body["error"]["message"] == "frobnicate: Extra inputs are not permitted"
    assert "budget_tokens" in caught["budget"].body["error"]["message"]


async def test_the_api_key_is_taken_from_x_api_key(scripted) -> None:
    with trio.fail_after(allowance(90)):
        async with running_server(scripted, api_key=KEY) as server:
            def good(client, model_id):
                return client.messages.create(model=model_id, max_tokens=8, messages=GREETING)

            def bad(client, model_id):
                try:
                    client.messages.count_tokens(model=model_id, messages=GREETING)
                except anthropic.AuthenticationError as exc:
                    return exc

            message = await with_client(server, good, api_key=KEY)
            refused = await with_client(server, bad, api_key="wrong")
            bearer = await fetch(server.port, "POST", "/v1/messages/count_tokens",
                                 {"model": server.state.model_id, "messages": GREETING},
                                 headers=(("authorization", f"Bearer {KEY}"),))
            missing = await fetch(server.port, "POST", "/v1/messages", {})
    assert message.type == "message"
    assert refused.status_code == 401 and refused.body["error"]["type"] == "authentication_error"
    assert bearer.status == 200 and bearer.json()["input_tokens"] > 0
    assert missing.status == 401 and missing.json()["error"]["type"] == "authentication_error"


async def test_the_routers_refusals_on_anthropics_paths_come_in_its_envelope(demo_model: Model) -> None:
    with trio.fail_after(allowance(60)):
        async with running_server(demo_model) as server:
            plain = await fetch(server.port, "POST", "/v1/messages", {}, content_type="text/plain")
            method = await fetch(server.port, "GET", "/v1/messages/count_tokens")
            bad_json = await fetch(server.port, "POST", "/v1/messages", None)
    assert plain.status == 415 and plain.json()["type"] == "error"
    assert plain.json()["error"]["type"] == "invalid_request_error"
    assert method.status == 405 and method.json()["type"] == "error"
    assert bad_json.status == 400 and bad_json.json()["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in bad_json.json()["error"]["message"]
