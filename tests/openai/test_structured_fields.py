"""response_format and structured_outputs: shapes, types and the field each refusal names."""

from __future__ import annotations

import json

import pytest

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai import StructuredOutput, parse_chat_request, parse_completion_request

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return parse_chat_request(json.dumps({"messages": MESSAGES, **fields}).encode())


def completion(**fields):
    return parse_completion_request(json.dumps({"prompt": "x", **fields}).encode())


def test_no_field_and_text_mean_free_output():
    assert chat().structured is None
    assert chat(response_format={"type": "text"}).structured is None
    assert completion(response_format=None).structured is None


def test_response_format_json_object_and_json_schema():
    assert chat(response_format={"type": "json_object"}).structured == StructuredOutput("json_object", "response_format")
    parsed = chat(response_format={"type": "json_schema", "json_schema": {
        "name": "Thing", "schema": SCHEMA, "strict": True, "description": "a thing"}}).structured
    assert parsed == StructuredOutput("json_schema", "response_format.json_schema.schema", schema=SCHEMA,
                                      name="Thing", strict=True)
    assert completion(response_format={"type": "json_object"}).structured.kind == "json_object"


@pytest.mark.parametrize("value, kind, attribute", [
    ({"json": SCHEMA}, "json_schema", ("schema", SCHEMA)),
    ({"json": json.dumps(SCHEMA)}, "json_schema", ("schema", SCHEMA)),
    ({"regex": "[0-9]+"}, "regex", ("text", "[0-9]+")),
    ({"grammar": 'root ::= "a"'}, "grammar", ("text", 'root ::= "a"')),
    ({"choice": ["yes", "no"]}, "choice", ("choices", ("yes", "no"))),
    ({"json_object": True}, "json_object", ("schema", None)),
])
def test_structured_outputs_takes_one_of_its_kinds(value, kind, attribute):
    for parsed in (chat(structured_outputs=value).structured, completion(structured_outputs=value).structured):
        key = next(iter(value))
        assert (parsed.kind, parsed.param) == (kind, f"structured_outputs.{key}")
        assert getattr(parsed, attribute[0]) == attribute[1]


@pytest.mark.parametrize("fields, param", [
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {}}, "response_format.type"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": []}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA, "strict": "yes"}}},
     "response_format.json_schema.strict"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA, "name": 3}}},
     "response_format.json_schema.name"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"guided_regex": "a"}}, "structured_outputs.guided_regex"),
    ({"structured_outputs": {"regex": ""}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": 5}}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["a", 1]}}, "structured_outputs.choice[1]"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs"),
])
def test_malformed_fields_are_refused_by_name(fields, param):
    for parse in (chat, completion):
        with pytest.raises(BadRequestError) as caught:
            parse(**fields)
        assert caught.value.param == param, caught.value.message
