"""Tools on a model whose chat template cannot render them: the real SmolLM2-135M-Instruct through a real server.

SmolLM2's template never reads ``tools`` and knows no ``tool_calls`` or ``tool``
role; the server renders them in the Hermes/Qwen convention instead
(kestrel_trio.text.chat_formats.hermes), so they reach the prompt and never vanish.
"""

from __future__ import annotations

import json

import pytest
import trio

from kestrel_trio import load_model
from real_models import smollm2_135m
from server_kit import client_for, fetch, running_server
from slow_host import allowance

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def smollm2():
    return load_model(smollm2_135m())


async def test_tools_reach_smollm2s_prompt_and_a_tool_round_trip_renders(smollm2) -> None:
    with trio.fail_after(allowance(180)):
        async with running_server(smollm2) as server:

            def chat(**request):
                with client_for(server) as client:
                    return client.chat.completions.create(**{"model": server.state.model_id, "temperature": 0,
                                                             "max_tokens": 1, **request})

            plain = await trio.to_thread.run_sync(lambda: chat(messages=QUESTION))
            with_tools = await trio.to_thread.run_sync(lambda: chat(messages=QUESTION, tools=TOOLS))
            assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # the tool's whole signature
            # The prompt as chat renders it: /tokenize takes tools as well, /detokenize gives the text back.
            tokenized = await fetch(server.port, "POST", "/tokenize", {"messages": QUESTION, "tools": TOOLS})
            assert tokenized.status == 200, tokenized.body
            ids = tokenized.json()["tokens"]
            text = (await fetch(server.port, "POST", "/detokenize", {"tokens": ids})).json()["prompt"]

            # A forced call, then its result sent back: the history's call and result render too.
            forced = await trio.to_thread.run_sync(lambda: chat(
                messages=QUESTION, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                max_tokens=32))
            message = forced.choices[0].message
            result = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": '{"temperature_c": 18}'}
            history = [*QUESTION, message.model_dump(exclude_none=True), result]
            after = await trio.to_thread.run_sync(lambda: chat(messages=history, tools=TOOLS))
            round_trip = await fetch(server.port, "POST", "/tokenize", {"messages": history, "tools": TOOLS})
            round_ids = round_trip.json()["tokens"]
            round_text = (await fetch(server.port, "POST", "/detokenize", {"tokens": round_ids})).json()["prompt"]

    assert with_tools.usage.prompt_tokens == len(ids)
    assert "get_weather" in text and json.dumps(TOOLS[0]) in text and "<tool_call>" in text
    assert forced.choices[0].finish_reason == "tool_calls" and message.tool_calls[0].function.name == "get_weather"
    assert after.usage.prompt_tokens == round_trip.json()["count"] > with_tools.usage.prompt_tokens
    assert '<tool_response>\n{"temperature_c": 18}\n</tool_response>' in round_text
    assert '<tool_call>\n{"name": "get_weather", "arguments": ' in round_text.split("What is the weather in Paris?")[1]
