"""Structured-output request fields: ``response_format`` (OpenAI) and ``structured_outputs`` (vLLM's extension).

Only shapes and types are checked here; schemas stay plain decoded JSON values.
Whether a schema, regex or grammar can be enforced is decided later, against
the model's tokenizer, where it is compiled (still before any compute).

* ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type":
  "json_object"}`` (any JSON object) or ``{"type": "json_schema",
  "json_schema": {"name", "schema", "strict", "description"}}``.
* ``structured_outputs`` (vLLM's name for it since 0.10.2; the older
  ``guided_*`` fields are not accepted): exactly one of ``json`` (a schema,
  as an object or as JSON text), ``regex``, ``choice`` (a non-empty array of
  strings), ``grammar`` (Lark in llguidance's dialect, or llama.cpp's GBNF) or
  ``json_object: true``.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import (
    check_object, check_str, fail, get_bool, get_object, get_str, join_path, require,
)
from kestrel_trio.openai.request.accepted_fields import CHAT, check_keys

__all__ = ["StructuredOutput", "parse_structured_output"]

_RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@attrs.frozen
class StructuredOutput:
    """What the output must be.

    Attributes:
        kind: ``json_object``, ``json_schema``, ``regex``, ``choice`` or ``grammar``.
        param: the request path of the value that defines it
            (``response_format.json_schema.schema``, ``structured_outputs.regex``, ...).
        schema: the JSON schema (``json_schema``), as decoded.
        text: the regular expression or the grammar text.
        choices: the allowed outputs (``choice``).
        name: ``response_format.json_schema.name``, if given.
        strict: ``response_format.json_schema.strict`` (the output always follows the
            schema exactly, so this changes nothing).
    """

    kind: str
    param: str
    schema: Any = None
    text: str | None = None
    choices: tuple[str, ...] = ()
    name: str | None = None
    strict: bool | None = None


def parse_structured_output(body: dict) -> StructuredOutput | None:
    """The structured-output fields of a chat or completions request body, or None when there are none.

    Raises:
        BadRequestError: a malformed field, or both fields at once (``param`` names it).
    """
    from_format = _response_format(body)
    from_extension = _structured_outputs(body)
    if from_format is not None and from_extension is not None:
        raise BadRequestError("Give either 'response_format' or 'structured_outputs', not both",
                              param="structured_outputs")
    return from_format or from_extension


def _response_format(body: dict) -> StructuredOutput | None:
    value = get_object(body, "response_format")
    if value is None:
        return None
    # Nested keys are checked like the body's: a misspelt one is refused, never ignored (no no-ops live here).
    check_keys(value, ("type", "json_schema"), endpoint=CHAT, path="response_format", generic="response_format")
    kind = check_str(require(value, "type", "response_format"), "response_format.type")
    if kind not in _RESPONSE_FORMAT_TYPES:
        raise BadRequestError(f"'response_format.type' must be one of {', '.join(_RESPONSE_FORMAT_TYPES)}; "
                              f"got {kind!r}", param="response_format.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object", "response_format")
    path = "response_format.json_schema"
    spec = check_object(require(value, "json_schema", "response_format"), path)
    check_keys(spec, ("name", "description", "strict", "schema"), endpoint=CHAT, path=path, generic=path)
    name = get_str(spec, "name", path)
    get_str(spec, "description", path)  # documentation for the model; checked, not used
    strict = get_bool(spec, "strict", path)
    schema_path = join_path(path, "schema")
    schema = check_object(require(spec, "schema", path), schema_path)
    return StructuredOutput("json_schema", schema_path, schema=schema, name=name, strict=strict)


def _structured_outputs(body: dict) -> StructuredOutput | None:
    value = get_object(body, "structured_outputs")
    if value is None:
        return None
    given = {key: item for key, item in value.items() if item is not None}
    unknown = sorted(set(given) - set(_STRUCTURED_KINDS))
    if unknown:
        field = join_path("structured_outputs", unknown[0])
        raise BadRequestError(f"'{field}' is not supported; 'structured_outputs' takes one of "
                              f"{', '.join(_STRUCTURED_KINDS)}", param=field)
    if len(given) != 1:
        raise BadRequestError(f"'structured_outputs' must hold exactly one of {', '.join(_STRUCTURED_KINDS)}",
                              param="structured_outputs")
    (key, item), = given.items()
    path = join_path("structured_outputs", key)
    if key == "json":
        return StructuredOutput("json_schema", path, schema=_schema(item, path))
    if key == "json_object":
        if item is not True:
            raise fail(path, "true", item)
        return StructuredOutput("json_object", path)
    if key == "choice":
        if not isinstance(item, list) or not item:
            raise fail(path, "a non-empty array of strings", item)
        return StructuredOutput("choice", path, choices=tuple(check_str(c, join_path(path, i)) for i, c in enumerate(item)))
    text = check_str(item, path)
    if not text:
        raise BadRequestError(f"'{path}' must not be empty", param=path)
    return StructuredOutput(key, path, text=text)


def _schema(value: Any, path: str) -> dict:
    """A JSON schema sent as an object or as JSON text holding one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise BadRequestError(f"'{path}' is not valid JSON: {exc}", param=path) from None
    return check_object(value, path)
