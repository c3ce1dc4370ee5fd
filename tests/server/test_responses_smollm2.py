"""The Responses API on a real trained model, SmolLM2-135M-Instruct (Q4_1 GGUF), through the official openai client.

SmolLM2 has no reasoning mode: ``reasoning.effort`` "none" holds already, one that asks for reasoning is a 400.
Its template renders no tools, so the server shows them as a Hermes-style system prompt; a forced call's
arguments are held to the schema by the grammar whatever the model would write.
"""

from __future__ import annotations

import json
from typing import Literal

import openai
import pydantic
import pytest
import trio

from kestrel_trio import load_model
from kestrel_trio.model import Model

from real_models import smollm2_135m
from server_kit import running_server

CAPITAL = "What is the capital of France?"
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                         "required": ["city"], "additionalProperties": False}}]


class Answer(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    city: Literal["Paris", "Lyon", "Marseille"]
    country: Literal["France", "Spain"]


@pytest.fixture(scope="module")
def smollm2() -> Model:
    return load_model(smollm2_135m())


async def with_client(server, work):
    def run():
        # A generous timeout: answers take a while on a loaded 2-core machine.
        with openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=900) as client:
            return work(client)

    return await trio.to_thread.run_sync(run)


async def test_smollm2_answers_streams_calls_and_follows_a_schema(smollm2: Model) -> None:
    with trio.fail_after(900):
        async with running_server(smollm2, model_id="smollm2") as server:
            def work(client):
                whole = client.responses.create(model="smollm2", input=CAPITAL, max_output_tokens=40,
                                                reasoning={"effort": "none"})
                with client.responses.stream(model="smollm2", input=CAPITAL, max_output_tokens=40) as stream:
                    deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
                    streamed = stream.get_final_response()
                call = client.responses.create(model="smollm2", input="Weather in Paris?", tools=TOOLS,
                                               tool_choice="required", parallel_tool_calls=False, max_output_tokens=60)
                parsed = client.responses.parse(model="smollm2", input=CAPITAL, text_format=Answer,
                                                max_output_tokens=40)
                try:
                    client.responses.create(model="smollm2", input=CAPITAL, reasoning={"effort": "high"})
                except openai.BadRequestError as exc:
                    refused = exc
                return whole, deltas, streamed, call, parsed, refused

            whole, deltas, streamed, call, parsed, refused = await with_client(server, work)
    assert "Paris" in whole.output_text and whole.status == "completed"
    assert streamed.output_text == "".join(deltas) == whole.output_text  # greedy: the same answer
    assert [item.type for item in whole.output] == ["message"]  # no reasoning item on a model that never reasons
    [item] = [item for item in call.output if item.type == "function_call"]
    assert item.name == "get_weather" and set(json.loads(item.arguments)) == {"city"}
    assert isinstance(parsed.output_parsed, Answer)
    assert refused.body["param"] == "reasoning.effort" and "no reasoning mode" in refused.body["message"]
