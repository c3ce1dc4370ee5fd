"""Structured outputs through the official openai client on the demo model (random weights, the real Qwen3 tokenizer).

Random weights never choose to close a string or end an array, so every
string here is bounded (maxLength, pattern or enum) and every array has
maxItems; validity is then the grammar's work alone. Responses are checked
with pydantic (strict, extra keys forbidden) and, for truncated JSON, with
the independent prefix check in tests/json_prefix.py.
"""

from __future__ import annotations

import concurrent.futures
import enum
import functools
import json
from typing import Literal, Optional

import openai
import pydantic
import pytest
import trio
from pydantic import BaseModel, ConfigDict, Field

from json_prefix import is_json_prefix, test_the_checker_itself  # noqa: F401 (the checker's own test runs here)
from kestrel_trio.engine import EngineLimits
from server_kit import client_for, fetch, running_server

QUESTION = [{"role": "user", "content": "Fill in the form."}]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Point(Strict):
    x: int = Field(ge=-5, le=5)
    y: int = Field(ge=0, le=9)


class Person(Strict):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)


class Colour(str, enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Shirt(Strict):
    colour: Colour
    size: Literal["S", "M", "L"]


class Address(Strict):
    street: str = Field(max_length=10)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Customer(Strict):
    name: str = Field(max_length=6)
    address: Address


class Item(Strict):
    sku: str = Field(pattern=r"^[A-Z]{3}-[0-9]{2}$")
    qty: int = Field(ge=1, le=9)


class Basket(Strict):
    items: list[Item] = Field(max_length=3)


class Reading(Strict):
    celsius: float = Field(ge=-40, le=60)
    humidity: float = Field(ge=0, le=1)


class Profile(Strict):
    nick: str = Field(max_length=5)
    bio: Optional[str] = Field(default=None, max_length=5)
    age: Optional[int] = Field(default=None, ge=0, le=99)


class Flags(Strict):
    on: bool
    tags: list[Literal["x", "y", "z"]] = Field(max_length=4)


class Leaf(Strict):
    v: int = Field(ge=0, le=3)
    note: Optional[Literal["a", "b"]] = None


class Tree(Strict):
    label: str = Field(max_length=3)
    children: list[Leaf] = Field(max_length=2)


class Event(Strict):
    kind: Literal["start", "stop"]
    at: str = Field(pattern=r"^[0-2][0-9]:[0-5][0-9]$")
    count: int = Field(ge=0, le=1000)
    ratio: float = Field(ge=0, le=10)


MODELS = [Point, Person, Shirt, Customer, Basket, Reading, Profile, Flags, Tree, Event]
# Each model twice: (stream, temperature) runs through all four combinations over the list.
PARSE_CASES = [(m, stream, temperature) for i, m in enumerate(MODELS)
               for stream, temperature in ((i % 2 == 0, 1.0), (i % 2 == 1, 0.0))]


BATCHED = EngineLimits(max_batch=8, max_queued=32)  # the acceptance runs 20 requests 8 at a time: batched steps


async def in_thread(server, work):
    def run():
        with client_for(server) as client:
            return work(client, server.state.model_id)
    return await trio.to_thread.run_sync(run)


async def concurrently(server, jobs: list) -> list:
    """Each ``job(client, model_id)`` on one of 8 client threads at once; their results in order."""
    def run():
        with client_for(server) as client, concurrent.futures.ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda job: job(client, server.state.model_id), jobs))
    return await trio.to_thread.run_sync(run)


def parse_one(schema, stream: bool, temperature: float, seed: int, client, model_id):
    request = dict(model=model_id, messages=QUESTION, response_format=schema, temperature=temperature, seed=seed,
                   max_tokens=200)
    if stream:
        with client.chat.completions.stream(**request) as events:
            return events.get_final_completion().choices[0]
    return client.chat.completions.parse(**request).choices[0]


async def test_twenty_parse_requests_all_parse_and_validate(demo_model) -> None:
    assert len(PARSE_CASES) == 20
    jobs = [functools.partial(parse_one, *case, seed) for seed, case in enumerate(PARSE_CASES)]
    with trio.fail_after(120):
        async with running_server(demo_model, engine_limits=BATCHED) as server:
            choices = await concurrently(server, jobs)
    for (schema, _, _), choice in zip(PARSE_CASES, choices):
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        assert isinstance(choice.message.parsed, schema)
        assert schema.model_validate_json(choice.message.content, strict=True) == choice.message.parsed
        assert choice.message.refusal is None and not choice.message.tool_calls


WEATHER = {"type": "object", "properties": {  # hand-written, no additionalProperties: closed by the server
    "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "unit"]}


class Weather(Strict):
    city: str = Field(max_length=12)
    unit: Literal["C", "F"]
    days: Optional[int] = Field(default=None, ge=1, le=7)


def tool_set():
    """(tools, validator by name): pydantic-made strict tools, raw pydantic schemas, and a hand-written one."""
    tools = [openai.pydantic_function_tool(Point, name="plot"), openai.pydantic_function_tool(Basket, name="buy"),
             {"type": "function", "function": {"name": "greet", "parameters": Person.model_json_schema()}},
             {"type": "function", "function": {"name": "nest", "parameters": Tree.model_json_schema()}},
             {"type": "function", "function": {"name": "weather", "parameters": WEATHER}}]
    return tools, {"plot": Point, "buy": Basket, "greet": Person, "nest": Tree, "weather": Weather}


def call_tools(tools, choice: str, stream: bool, seed: int, client, model_id):
    """The calls made (name, arguments) and the finish_reason of one forced tool call."""
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    request = dict(model=model_id, messages=QUESTION, tools=tools, tool_choice=tool_choice, seed=seed,
                   max_tokens=300, temperature=1.0 if seed % 3 else 0.0)
    if not stream:
        answer = client.chat.completions.create(**request).choices[0]
        return [(c.function.name, c.function.arguments) for c in answer.message.tool_calls], answer.finish_reason
    calls, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        for delta in chunk.choices[0].delta.tool_calls or []:
            slot = calls.setdefault(delta.index, ["", ""])
            slot[0] += delta.function.name or ""
            slot[1] += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return [tuple(slot) for slot in calls.values()], finish


async def test_twenty_forced_tool_calls_validate_against_their_schemas(demo_model) -> None:
    tools, validators = tool_set()
    names = list(validators)
    cases = [("required" if i % 4 == 0 else names[i % len(names)], i % 2 == 1) for i in range(20)]
    jobs = [functools.partial(call_tools, tools, choice, stream, seed) for seed, (choice, stream) in enumerate(cases)]
    with trio.fail_after(120):
        async with running_server(demo_model, engine_limits=BATCHED) as server:
            results = await concurrently(server, jobs)
    for (choice, _), (made, finish) in zip(cases, results):
        assert finish == "tool_calls" and made, (choice, made, finish)
        if choice != "required":
            assert [name for name, _ in made] == [choice]
        for name, arguments in made:
            validators[name].model_validate_json(arguments, strict=True)


def json_object_one(i: int, client, model_id) -> tuple[str, str]:
    """The text and finish_reason of one json_object request: chat or completions, streamed or not."""
    request = dict(model=model_id, max_tokens=6 + 3 * i, seed=i, temperature=1.0 if i % 2 else 0.0)
    json_object = {"type": "json_object"}
    chat, stream = i % 4 < 2, i % 2 == 1
    if chat:
        made = client.chat.completions.create(messages=QUESTION, stream=stream, response_format=json_object, **request)
        pieces = [(c.choices[0].delta.content or "", c.choices[0].finish_reason) for c in made] if stream \
            else [(made.choices[0].message.content, made.choices[0].finish_reason)]
    else:
        made = client.completions.create(prompt="JSON:", stream=stream, extra_body={"response_format": json_object},
                                         **request)
        pieces = [(c.choices[0].text, c.choices[0].finish_reason) for c in made] if stream \
            else [(made.choices[0].text, made.choices[0].finish_reason)]
    return "".join(text for text, _ in pieces), [f for _, f in pieces if f][-1]


async def test_twenty_json_object_requests_give_json_or_a_prefix_cut_by_length(demo_model) -> None:
    with trio.fail_after(120):
        async with running_server(demo_model, engine_limits=BATCHED) as server:
            results = await concurrently(server, [functools.partial(json_object_one, i) for i in range(20)])
    for text, finish in results:
        assert text.startswith("{"), text
        if finish == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert finish == "length" and is_json_prefix(text), text


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}},
     "response_format.json_schema.schema.properties.tags.uniqueItems"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "format": "colour"}}}},
     "response_format.json_schema.schema.format"),
    ({"structured_outputs": {"regex": "(?<=a)b"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs.grammar"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"if": {"type": "string"}, "then": {"maxLength": 2}}}}}}],
      "tool_choice": "required"}, "tools[0].function.parameters.properties.a.if"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "structured_outputs": {"regex": "a"}},
     "structured_outputs.regex"),
])
async def test_a_constraint_that_cannot_be_enforced_is_a_400_before_any_compute(demo_model, body, param) -> None:
    with trio.fail_after(60):
        async with running_server(demo_model) as server:
            response = await fetch(server.port, "POST", "/v1/chat/completions",
                                   {"messages": QUESTION, "max_tokens": 4, **body})
            assert server.state.engine.metrics.accepted.value() == 0  # nothing was queued
    assert response.status == 400, response.body
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


async def test_completions_take_regex_choice_and_grammars(demo_model) -> None:
    cases = [({"regex": r"[0-9]{3}-[a-z]{2}"}, lambda t: len(t) == 6 and t[:3].isdigit() and t[3] == "-"),
             ({"choice": ["alpha", "beta", "gamma"]}, lambda t: t in ("alpha", "beta", "gamma")),
             ({"grammar": 'root ::= "yes" | "no"'}, lambda t: t in ("yes", "no")),
             ({"grammar": 'start: "(" NUM ")"\nNUM: /[0-9]{1,3}/'}, lambda t: t[0] == "(" and t[-1] == ")")]

    def work(client, model_id):
        return [client.completions.create(model=model_id, prompt="Answer:", max_tokens=20, seed=i,
                                          extra_body={"structured_outputs": spec}).choices[0]
                for i, (spec, _) in enumerate(cases)]

    with trio.fail_after(60):
        async with running_server(demo_model) as server:
            choices = await in_thread(server, work)
    for (spec, check), choice in zip(cases, choices):
        assert choice.finish_reason == "stop" and check(choice.text), (spec, choice.text)


async def test_every_choice_of_n_is_held_to_the_schema(demo_model) -> None:
    def work(client, model_id):
        return client.chat.completions.parse(model=model_id, messages=QUESTION, response_format=Shirt, n=3, seed=7)

    with trio.fail_after(60):
        async with running_server(demo_model) as server:
            completion = await in_thread(server, work)
    assert [type(c.message.parsed) for c in completion.choices] == [Shirt] * 3


async def test_reasoning_on_request_stays_free_and_the_answer_after_it_is_constrained(demo_model, monkeypatch) -> None:
    from kestrel_trio.text.generation import Generation

    tokenizer = demo_model.require_tokenizer()
    script = tokenizer.encode("Colour first, then size. <tool_call>{{ not JSON\n</think>\n\n")
    real_advance = Generation.advance

    def advance(generation, logits):  # the model "reasons" (scripted), then random weights answer
        step = len(generation.generated_ids)
        if step < len(script) and generation.phase.value == "decode" or (step == 0 and generation.samples_next):
            logits = logits.copy()  # [vocab]
            logits[script[step]] = logits.max() + 50.0
        return real_advance(generation, logits)

    monkeypatch.setattr(Generation, "advance", advance)

    def work(client, model_id):
        return client.chat.completions.parse(model=model_id, messages=QUESTION, response_format=Shirt, seed=3,
                                             extra_body={"chat_template_kwargs": {"enable_thinking": True}})

    with trio.fail_after(60):
        async with running_server(demo_model) as server:
            completion = await in_thread(server, work)
    message = completion.choices[0].message
    assert message.reasoning_content == "Colour first, then size. <tool_call>{{ not JSON\n"
    assert isinstance(message.parsed, Shirt) and completion.choices[0].finish_reason == "stop"


async def test_without_enable_thinking_a_constrained_answer_skips_reasoning(demo_model) -> None:
    def work(client, model_id):
        free = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=1)
        constrained = client.chat.completions.parse(model=model_id, messages=QUESTION, response_format=Point)
        return free, constrained

    with trio.fail_after(60):
        async with running_server(demo_model) as server:
            free, constrained = await in_thread(server, work)
    # The constrained prompt got Qwen3's empty reasoning block (what enable_thinking=False renders).
    empty_block = len(demo_model.encode("<think>\n\n</think>\n\n"))
    assert constrained.usage.prompt_tokens == free.usage.prompt_tokens + empty_block
    assert isinstance(constrained.choices[0].message.parsed, Point)
    assert getattr(constrained.choices[0].message, "reasoning_content", None) is None


async def test_metrics_count_constrained_requests_and_mask_time(demo_model) -> None:
    def work(client, model_id):
        client.chat.completions.parse(model=model_id, messages=QUESTION, response_format=Point, seed=1)
        client.completions.create(model=model_id, prompt="x", max_tokens=3,
                                  extra_body={"structured_outputs": {"regex": "[a-z]+"}})

    with trio.fail_after(60):
        async with running_server(demo_model) as server:
            await in_thread(server, work)
            text = (await fetch(server.port, "GET", "/metrics")).body.decode()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines['kestrel:structured_output_requests_total{kind="json_schema"}']) == 1
    assert float(lines['kestrel:structured_output_requests_total{kind="regex"}']) == 1
    assert float(lines["kestrel:grammar_mask_seconds_count"]) >= 4  # one per constrained step
    assert float(lines["kestrel:grammar_mask_seconds_sum"]) > 0
    assert "kestrel:grammar_mask_wait_seconds_total" in lines


def test_pydantic_validation_is_strict_here() -> None:
    """The validators above would catch a wrong answer: a string for an int, an extra key."""
    with pytest.raises(pydantic.ValidationError):
        Point.model_validate_json('{"x": "1", "y": 2}', strict=True)
    with pytest.raises(pydantic.ValidationError):
        Point.model_validate_json('{"x": 1, "y": 2, "z": 3}', strict=True)
