"""Tool calls through the official openai client, on the fixture checkpoint and on the demo model.

Random weights never write a tool call, so these tests script the model: the
real forward pass runs, then the scripted next token is made to win by a wide
logit margin before the real sampler sees the logits. Everything downstream (sampling,
detokenization, the engine, the routes, HTTP, SSE) is the real code; only the
model's choice of tokens is dictated.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from collections.abc import Callable

import openai
import pytest
import trio

from kestrel_trio.model import Model
from kestrel_trio.openai import parse_chat_request
from kestrel_trio.server import Server

import server_kit
from server_kit import client_for, fetch, in_worker, running_server

# Small enough that a tool prompt plus the call fit the fixture's 512-token context.
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
ANSWER = "It is 18 degrees and clear in Oslo."
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
QUESTION = [{"role": "user", "content": "Weather in Oslo?"}]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_loop.py"


def script(prompt: str) -> str:
    """What the scripted model answers to a rendered prompt."""
    if "GREET" in prompt:
        return "Hello there!"
    if "<tool_response>" in prompt:
        return ANSWER
    if prompt.endswith('"arguments": '):  # tool_choice named a function
        return '{"city": "Oslo"}}\n</tool_call>'
    if prompt.endswith("<tool_call>\n"):  # tool_choice "required"
        return CALL[len("<tool_call>\n"):]
    if "TWICE" in prompt:
        return CALL + "\n" + CALL.replace("Oslo", "Bergen")
    if "MALFORMED" in prompt:
        return 'Sure.\n<tool_call>\n{"name": get_weather}\n</tool_call>'
    return "Let me check.\n\n" + CALL


class ScriptedModel(server_kit.ScriptedModel):
    """The model scripted by :func:`script` (:class:`server_kit.ScriptedModel`)."""

    def __init__(self, model: Model) -> None:
        super().__init__(model, script)


@pytest.fixture
def scripted(model: Model, monkeypatch: pytest.MonkeyPatch) -> ScriptedModel:
    return ScriptedModel(model).install(monkeypatch)


async def in_thread(server: Server, work: Callable[[openai.OpenAI, str], object]):
    return await in_worker(lambda: client_for(server), work, server.state.model_id)


async def full_and_streamed(server: Server, **request) -> tuple[object, list]:
    """The same chat completion asked for twice through the official client: whole, then streamed (its chunks)."""
    def work(client, model_id):
        full = client.chat.completions.create(model=model_id, **request)
        return full, list(client.chat.completions.create(model=model_id, stream=True, **request))

    return await in_thread(server, work)


def streamed_calls(chunks) -> tuple[str, dict, list[str]]:
    content, calls, finishes = "", {}, []
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": call.id, "name": call.function.name, "arguments": ""})
                if call.id is not None:
                    assert slot["id"] == call.id and call.type == "function" and call.function.arguments == ""
                else:
                    assert call.function.name is None
                slot["arguments"] += call.function.arguments or ""
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    return content, calls, finishes


async def test_a_tool_call_round_trips_streamed_and_not(scripted) -> None:
    with trio.fail_after(60):
        async with running_server(scripted.model) as server:
            full, chunks = await full_and_streamed(server, messages=QUESTION, tools=TOOLS)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert call.id.startswith("call_") and len(call.id) > len("call_")
    content, calls, finishes = streamed_calls(chunks)
    assert content == "Let me check." and "<tool_call>" not in content
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", {"city": "Oslo"})]
    assert finishes == ["tool_calls"]


async def test_tool_choice_none_renders_no_tools_and_parses_nothing(scripted) -> None:
    with trio.fail_after(60):
        async with running_server(scripted.model) as server:
            def work(client, model_id):
                auto = client.chat.completions.create(model=model_id, messages=QUESTION, tools=TOOLS)
                none = client.chat.completions.create(model=model_id, messages=QUESTION, tools=TOOLS,
                                                      tool_choice="none")
                return auto, none

            auto, none = await in_thread(server, work)
            bare = (await fetch(server.port, "POST", "/tokenize", {"messages": QUESTION})).json()["count"]
    assert none.usage.prompt_tokens == bare < auto.usage.prompt_tokens
    assert none.choices[0].finish_reason == "stop" and not none.choices[0].message.tool_calls
    assert CALL in none.choices[0].message.content


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_required_and_named_tool_choice_force_the_call_opening(scripted, tool_choice) -> None:
    with trio.fail_after(60):
        async with running_server(scripted.model) as server:
            full, chunks = await full_and_streamed(server, messages=QUESTION, tools=TOOLS, tool_choice=tool_choice)
    assert full.choices[0].finish_reason == "tool_calls"
    assert full.choices[0].message.content is None
    assert [json.loads(c.function.arguments) for c in full.choices[0].message.tool_calls] == [{"city": "Oslo"}]
    content, calls, finishes = streamed_calls(chunks)
    assert (content, finishes) == ("", ["tool_calls"])
    assert [c["name"] for c in calls.values()] == ["get_weather"]


@pytest.mark.parametrize("parallel", [None, True, False])
async def test_parallel_tool_calls_false_returns_only_the_first_call(demo_model: Model, monkeypatch, parallel) -> None:
    """On the demo model only: two calls after a tool prompt do not fit the fixture's 512-token context."""
    scripted = ScriptedModel(demo_model).install(monkeypatch)
    question = [{"role": "user", "content": "Weather in Oslo and Bergen? TWICE"}]
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    with trio.fail_after(60):
        async with running_server(scripted.model) as server:
            full, chunks = await full_and_streamed(server, messages=question, tools=TOOLS, **extra)
    expected = [{"city": "Oslo"}] if parallel is False else [{"city": "Oslo"}, {"city": "Bergen"}]
    assert [json.loads(c.function.arguments) for c in full.choices[0].message.tool_calls] == expected
    content, calls, finishes = streamed_calls(chunks)
    assert [json.loads(c["arguments"]) for c in calls.values()] == expected
    assert full.choices[0].finish_reason == "tool_calls" and finishes == ["tool_calls"]


async def test_a_malformed_tool_call_is_held_to_the_schema(demo_model: Model, monkeypatch) -> None:
    # The script writes '{"name": get_weather}' after <tool_call>; from that tag on the grammar decides, so the
    # call comes out valid (city bounded: random weights alone never close a string). The demo model only: the
    # fixture's 512-token context has no room for a call spelled in its character-sized tokens.
    scripted = ScriptedModel(demo_model).install(monkeypatch)
    question = [{"role": "user", "content": "MALFORMED please"}]
    bounded = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}]
    with trio.fail_after(60):
        async with running_server(scripted.model) as server:
            full, chunks = await full_and_streamed(server, messages=question, tools=bounded, max_tokens=40)
    choice = full.choices[0]
    content, calls, finishes = streamed_calls(chunks)
    answers = [(choice.message.content, [(c.function.name, c.function.arguments) for c in choice.message.tool_calls],
                choice.finish_reason), (content, [(c["name"], c["arguments"]) for c in calls.values()], finishes[-1])]
    for text, made, finish in answers:  # the whole answer and the streamed one (each its own draw)
        [(name, arguments)] = made
        arguments = json.loads(arguments)
        assert name == "get_weather" and set(arguments) == {"city"} and len(arguments["city"]) <= 12
        assert text.startswith("Sure.") and "<tool_call>" not in text
        assert finish in ("tool_calls", "length")


async def test_tool_validation_errors_name_the_field(model: Model) -> None:
    cases = [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ]
    with trio.fail_after(60):
        async with running_server(model) as server:
            for extra, param in cases:
                response = await fetch(server.port, "POST", "/v1/chat/completions",
                                       {"messages": QUESTION, "max_tokens": 2, **extra})
                assert response.status == 400, response.body
                assert response.json()["error"]["param"] == param


def test_a_tool_turn_renders_with_the_model_template(model: Model) -> None:
    body = {"messages": [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 18}'},
    ], "tools": TOOLS}
    request = parse_chat_request(json.dumps(body).encode())
    prompt = model.apply_chat_template(request.template_messages(), add_generation_prompt=True, tools=list(request.tools))
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in prompt  # the tool schema
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"temperature_c": 18}\n</tool_response>' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


async def test_the_agent_loop_example_runs_against_the_server(demo_model: Model, monkeypatch) -> None:
    """On the demo model only: a whole tool turn does not fit the fixture's 512-token context."""
    scripted = ScriptedModel(demo_model).install(monkeypatch)
    spec = importlib.util.spec_from_file_location("agent_loop", EXAMPLE)
    agent_loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_loop)
    with trio.fail_after(60):
        async with running_server(scripted.model) as server:
            text, conversation = await in_thread(
                server, lambda client, model_id: agent_loop.run_agent(client, model_id, "Weather in Oslo?"))
    assert text == ANSWER
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool"]
    assert conversation[1]["content"] == "Let me check."
    assert conversation[2]["tool_call_id"] == conversation[1]["tool_calls"][0]["id"]
    assert json.loads(conversation[2]["content"])["temperature_c"] == 18
