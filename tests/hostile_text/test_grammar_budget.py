"""Issue 49 items 1 and 8: a schema over the compile budgets is a 400 naming its keyword, never a dead process.

llguidance's JSON compiler unrolls array item counts before its own limits apply
(kestrel_trio.text.constraints.schema_budget): ``minItems`` 10^9 grew the process until the kernel (or, under a
limit, Rust's abort) ended it. Deep schemas gave a 500 and a RecursionError; compiler internals (panics,
backtraces) must not reach a 400 body.
"""

from __future__ import annotations

import json

import pytest
import trio
from hostile_text_kit import run_child

from kestrel_trio.errors import BadRequestError
from kestrel_trio.model import Model
from kestrel_trio.text.constraints.grammar import clean_message
from kestrel_trio.text.constraints.schema_budget import MAX_DEPTH, MAX_ITEMS, check_schema_budget
from server_kit import assert_envelope, fetch, running_server

HUGE = 10**9
QUESTION = [{"role": "user", "content": "Hi"}]


def deep_schema(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema, "maxItems": 2}
    return schema


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


@pytest.mark.parametrize("keyword", ["minItems", "maxItems", "minContains", "maxContains"])
def test_an_item_count_over_budget_names_its_keyword(keyword: str) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "array", keyword: HUGE}}}
    with pytest.raises(BadRequestError) as caught:
        check_schema_budget(schema, "response_format.json_schema.schema")
    assert caught.value.param == f"response_format.json_schema.schema.properties.a.{keyword}"
    assert keyword in caught.value.message and str(MAX_ITEMS) in caught.value.message


def test_item_counts_add_up_over_a_request() -> None:
    within = {"type": "array", "maxItems": MAX_ITEMS}
    spent = check_schema_budget(within, "a")
    for i in range(3):
        spent = check_schema_budget(within, f"tools[{i}]", spent=spent)
    with pytest.raises(BadRequestError) as caught:
        check_schema_budget({"type": "object", "properties": {"b": within}}, "tools[3]", spent=spent)
    assert caught.value.param == "tools[3].properties.b.maxItems"


def test_a_deep_schema_is_refused_without_recursion() -> None:
    with pytest.raises(BadRequestError) as caught:
        check_schema_budget(deep_schema(5000), "p")  # far deeper than Python's recursion limit
    assert "deep" in caught.value.message and caught.value.param.startswith("p.items.items")
    check_schema_budget(deep_schema(MAX_DEPTH // 2 - 1), "p")


def test_compiler_internals_never_reach_a_message() -> None:
    panic = ("thread '<unnamed>' panicked at src/json/compiler.rs:10:5:\ncapacity overflow\n<backtrace>\n"
             "   0: rust_begin_unwind\n")
    assert "panicked" not in clean_message(panic) and "backtrace" not in clean_message(panic)
    long = "bad grammar: " + "x" * 10_000 + "\n<backtrace>\n  0: frame"
    cleaned = clean_message(long)
    assert len(cleaned) < 600 and "backtrace" not in cleaned and cleaned.startswith("bad grammar")


@pytest.mark.parametrize("schema", [{"type": "array", "minItems": HUGE},
                                    {"type": "array", "minItems": 10**7},
                                    {"type": "object", "properties": {"x": {"type": "array", "maxItems": HUGE}}}])
def test_compiling_a_hostile_schema_stays_within_a_memory_bound(schema: dict) -> None:
    """In a child process limited to its own size plus 300 MB: today's main grows past it (or aborts)."""
    code, result, stderr = run_child(f"""
        from kestrel_trio.model import load_demo_model
        from kestrel_trio import openai as oa
        from kestrel_trio.app.chat.grammar import completion_constraint
        from kestrel_trio.errors import BadRequestError
        model = load_demo_model()
        structured = oa.StructuredOutput("json_schema", "response_format.json_schema.schema",
                                         schema=json.loads({json.dumps(json.dumps(schema))}))
        completion_constraint(model, oa.StructuredOutput("json_object", "response_format"))  # the vocabulary
        limit(300 * 2**20)
        try:
            completion_constraint(model, structured)
            report(outcome="compiled")
        except BadRequestError as exc:
            report(outcome="400", param=exc.param, message=exc.message)
    """)
    assert code == 0 and result is not None, stderr
    assert result["outcome"] == "400", result
    assert result["param"].startswith("response_format.json_schema.schema") and "Items" in result["param"]


async def test_a_server_answers_hostile_schemas_with_400s_and_stays_healthy(demo_model: Model) -> None:
    cases = [  # (body, the start of the error's param)
        ({"messages": QUESTION, "response_format": response_format({"type": "array", "minItems": HUGE})},
         "response_format.json_schema.schema.minItems"),
        ({"messages": QUESTION, "tools": [tool({"type": "object", "properties": {
            "v": {"type": "array", "maxItems": HUGE}}})]}, "tools[0].function.parameters.properties.v.maxItems"),
        ({"messages": QUESTION, "tools": [tool({"type": "object", "properties": {"v": deep_schema(400)}})],
          "tool_choice": "required"}, "tools[0].function.parameters.properties.v.items"),
        ({"messages": QUESTION, "response_format": response_format(deep_schema(400))},
         "response_format.json_schema.schema.items"),
    ]
    with trio.fail_after(120):
        async with running_server(demo_model) as server:
            answers = [await fetch(server.port, "POST", "/v1/chat/completions", {**body, "max_tokens": 2})
                       for body, _ in cases]
            fine = await fetch(server.port, "POST", "/v1/chat/completions", {
                "messages": QUESTION, "max_tokens": 3,
                "response_format": response_format({"type": "array", "items": {"type": "integer"}, "maxItems": 3})})
            health = await fetch(server.port, "GET", "/health")
    for (_, param), answer in zip(cases, answers):
        error = assert_envelope(answer, 400)
        assert error["param"].startswith(param), error
        assert "Traceback" not in error["message"] and "backtrace" not in error["message"]
    assert fine.status == 200, fine.body
    assert health.status == 200
