"""Every response shape the server sends, checked against OpenAI's OpenAPI spec (the committed extract), and a
tool call's streamed arguments read back through the official clients' own streaming helpers.

The model is the demo model scripted as in test_tools.py (the real forward pass runs; the scripted next token is
made to win), so answers with tool calls, stops and lengths come when asked for.
"""

from __future__ import annotations

import json

import anthropic
import pytest
import trio

from kestrel_trio.model import Model

from openai_spec import sse_violations, violations
from server_kit import HOST, client_for, fetch, running_server
from test_tools import QUESTION, TOOLS, ScriptedModel

GREET = [{"role": "user", "content": "GREET me"}]


@pytest.fixture
def scripted(demo_model: Model, monkeypatch: pytest.MonkeyPatch) -> ScriptedModel:
    return ScriptedModel(demo_model).install(monkeypatch)


CHATS = {  # name -> request fields; each is sent whole and streamed (with and without usage)
    "text": {"messages": GREET},
    "n2_seed": {"messages": GREET, "n": 2, "seed": 1},
    "logprobs": {"messages": GREET, "logprobs": True, "top_logprobs": 2},
    "stop": {"messages": GREET, "stop": ["there"]},
    "length": {"messages": GREET, "max_tokens": 2},
    "tool_call": {"messages": QUESTION, "tools": TOOLS},
    "tool_call_logprobs_n2": {"messages": QUESTION, "tools": TOOLS, "logprobs": True, "n": 2},
    "forced_tool": {"messages": QUESTION, "tools": TOOLS,
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "cut_tool_call": {"messages": QUESTION, "tools": TOOLS, "max_tokens": 12},
    "json_object": {"messages": GREET, "response_format": {"type": "json_object"}, "max_tokens": 8},
}
COMPLETIONS = {
    "plain": {"prompt": "GREET:"},
    "echo_logprobs": {"prompt": "GREET:", "echo": True, "logprobs": 2},
    "n2_length": {"prompt": "GREET:", "n": 2, "max_tokens": 3},
}
ERRORS = [  # (method, path, body): refusals in OpenAI's error envelope
    ("POST", "/v1/chat/completions", {"messages": []}),
    ("POST", "/v1/chat/completions", {"messages": GREET, "model": "no-such-model"}),
    ("POST", "/v1/chat/completions", {"messages": GREET, "reasoning_effort": "extreme"}),
    ("POST", "/v1/chat/completions", {"messages": GREET, "audio": {"voice": "x"}}),
    ("POST", "/v1/completions", {"prompt": ""}),
    ("GET", "/v1/models/no-such-model", None),
    ("GET", "/v1/no-such-route", None),
    ("DELETE", "/v1/models", None),
]


async def test_every_response_shape_conforms_to_the_spec(scripted: ScriptedModel) -> None:
    found: dict[str, list[str]] = {}
    checked = 0
    with trio.fail_after(600):
        async with running_server(scripted.model) as server:
            model = server.state.model_id
            for path, cases, kind in (("/v1/chat/completions", CHATS, "chat_completion"),
                                      ("/v1/completions", COMPLETIONS, "completion")):
                for name, fields in cases.items():
                    for mode, extra in (("whole", {}), ("stream", {"stream": True}),
                                        ("stream_usage", {"stream": True,
                                                          "stream_options": {"include_usage": True}})):
                        response = await fetch(server.port, "POST", path, {"model": model, **fields, **extra})
                        assert response.status == 200, (name, response.body)
                        problems = (violations(kind, response.json()) if mode == "whole"
                                    else sse_violations(f"{kind}_chunk", response.body))
                        found[f"{path} {name} {mode}"] = problems
                        checked += 1
            for kind, target in (("model_list", "/v1/models"), ("model", f"/v1/models/{model}")):
                response = await fetch(server.port, "GET", target)
                found[target] = violations(kind, response.json())
                checked += 1
            for method, target, body in ERRORS:
                response = await fetch(server.port, method, target, body)
                assert response.status >= 400, (target, body)
                found[f"{method} {target} {body} -> {response.status}"] = violations("error", response.json())
                checked += 1
    assert {name: problems for name, problems in found.items() if problems} == {}
    assert checked == 3 * (len(CHATS) + len(COMPLETIONS)) + 2 + len(ERRORS)


async def test_streamed_arguments_add_up_to_the_final_ones_in_the_official_clients(scripted: ScriptedModel) -> None:
    """openai's ``chat.completions.stream`` helper and anthropic's ``messages.stream``: the argument deltas come
    in several pieces, and what they add up to is the final call's arguments, equal to the non-streamed answer's."""

    def work(server):
        with client_for(server) as client:
            with client.chat.completions.stream(model=server.state.model_id, messages=QUESTION,
                                                tools=TOOLS) as stream:
                deltas = [event.arguments_delta for event in stream
                          if event.type == "tool_calls.function.arguments.delta"]
                final = stream.get_final_completion()
            whole = client.chat.completions.create(model=server.state.model_id, messages=QUESTION, tools=TOOLS)
        claude = anthropic.Anthropic(base_url=f"http://{HOST}:{server.port}", api_key="unused", max_retries=0)
        anthropic_tools = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
        with claude.messages.stream(model=server.state.model_id, messages=QUESTION, max_tokens=64,
                                    tools=anthropic_tools) as stream:
            pieces = [event.partial_json for event in stream if event.type == "input_json"]
            message = stream.get_final_message()
        return deltas, final, whole, pieces, message

    with trio.fail_after(120):
        async with running_server(scripted.model) as server:
            deltas, final, whole, pieces, message = await trio.to_thread.run_sync(work, server)
    [call] = final.choices[0].message.tool_calls
    assert len(deltas) > 3 and "".join(deltas) == call.function.arguments == '{"city": "Oslo"}'
    assert whole.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    assert final.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    [tool_use] = [block for block in message.content if block.type == "tool_use"]
    assert len(pieces) > 3 and json.loads("".join(pieces)) == tool_use.input == {"city": "Oslo"}
    assert message.stop_reason == "tool_use"
