"""Grammar text for structured outputs: JSON schemas, regexes, choices, Lark/GBNF grammars and Qwen tool calls.

Every builder returns an llguidance grammar (the serialized form that
``llguidance.LLMatcher`` takes); nothing here needs a tokenizer. Binding a
grammar to a model's tokenizer, and the token masks, are
:mod:`kestrel_trio.text.constraints.constraint`.

Choices made here, all documented in docs/structured-outputs.md:

* JSON is written in one fixed layout, ``{"a": 1, "b": [2, 3]}`` (Python's
  ``json.dumps`` and Qwen's own tool-call layout): no other whitespace. A model
  that may put any whitespace anywhere can loop in it forever (random weights
  do), and this layout is the one models are trained on.
* An object schema that lists ``properties`` and says nothing about other keys
  is closed (``additionalProperties: false``), as OpenAI's strict mode
  requires and xgrammar's strict mode assumes. The output still validates
  against the schema as sent; a model just cannot invent keys whose names
  would be unbounded strings. A bare ``{"type": "object"}`` stays open.
* A ``"type": "number"`` without ``multipleOf`` gets at most nine decimal
  places (``multipleOf: 1e-9``): a model that never stops writing digits
  (random weights do, and a looping model at temperature 0) then still ends
  its number; nine places are more than a float's typical use needs.
* ``propertyNames`` that allows every string (``{"type": "string"}``, ``{}``,
  ``true``: what zod writes for a record, as in Claude Code's tools) is dropped:
  every key of a JSON object is a string, so it constrains nothing, and
  llguidance does not implement the keyword. Any other ``propertyNames`` is
  refused as below.
* A keyword llguidance cannot enforce is an error (never silently ignored):
  :func:`schema_error` turns llguidance's message into a 400 whose ``param``
  is the path to the keyword inside the request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import llguidance

from kestrel_trio.errors import BadRequestError
from kestrel_trio.text.chat_formats import hermes

__all__ = [
    "JSON_LAYOUT",
    "json_schema_grammar",
    "json_object_grammar",
    "regex_grammar",
    "choice_grammar",
    "lark_grammar",
    "tool_call_schema",
    "tool_calls_grammar",
    "close_objects",
    "MAX_DECIMALS",
    "MAX_CALLS",
    "schema_error",
    "clean_message",
    "MAX_MESSAGE_CHARS",
]

# The one JSON layout generated; "lenient: false" keeps a schema's own "x-guidance" from ignoring keywords.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
               "lenient": False, "coerce_one_of": False}

MAX_DECIMALS = 9  # decimal places of a JSON number whose schema sets no multipleOf
MAX_MESSAGE_CHARS = 500  # of an llguidance error put into a 400 (its verbose errors may dump grammar and state)
_ANY_KEY = {"type": "string"}  # a propertyNames that every key meets
MAX_CALLS = 8  # tool calls in one answer held to a grammar ("required", or an answer that calls tools)

# Keywords whose value is a map of subschemas, one subschema, or a list of subschemas (JSON Schema 2020-12,
# plus draft-7's definitions/additionalItems). Only these are walked: "properties" may name a key "properties".
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("items", "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contentSchema")
_SCHEMA_LISTS = ("prefixItems", "anyOf", "allOf", "oneOf", "items")
# An object with any of these decides its other keys itself (or merges with a sibling schema): left as sent.
_OPEN_DECIDERS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf", "anyOf", "oneOf",
                  "$ref", "dependentSchemas", "if")
_KEYWORDS = (
    *_SCHEMA_MAPS, *_SCHEMA_ONE, "prefixItems", "anyOf", "allOf", "oneOf", "type", "enum", "const", "format",
    "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minItems", "maxItems", "uniqueItems", "minContains", "maxContains", "minProperties", "maxProperties",
    "required", "dependentRequired", "$ref", "$dynamicRef", "$anchor", "$dynamicAnchor",
)


def json_schema_grammar(schema: Mapping[str, Any]) -> str:
    """The grammar of JSON text valid under ``schema`` (objects closed, see module doc)."""
    return llguidance.LLMatcher.grammar_from_json_schema(close_objects(schema), overrides=JSON_LAYOUT)


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's ``{"type": "json_object"}``)."""
    return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_LAYOUT)


def regex_grammar(pattern: str) -> str:
    """Text that fully matches ``pattern`` (Rust ``regex`` syntax, no look-around)."""
    return llguidance.LLMatcher.grammar_from_regex(pattern)


def choice_grammar(choices: Sequence[str]) -> str:
    """Exactly one of ``choices``."""
    return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))


def lark_grammar(text: str) -> str:
    """A Lark-syntax (llguidance dialect) or GBNF (llama.cpp) grammar; GBNF is converted to Lark.

    Raises:
        ValueError: GBNF that cannot be converted.
    """
    return llguidance.grammar_from("grammar", text)


def tool_call_schema(name: str, parameters: Mapping[str, Any], defs: dict | None = None) -> dict:
    """The JSON of one Qwen (Hermes) tool call: ``{"name": <name>, "arguments": <parameters>}``, in that order.

    Args:
        name: the function's name.
        parameters: its parameters schema.
        defs: where to put ``parameters`` when they use local ``$ref`` pointers (which point at the root
            of the schema they came in, no longer the root here): under ``$defs``, refs rebased to it.
    """
    arguments = close_objects(parameters)
    if defs is not None and _has_local_refs(arguments):
        key = f"kestrel_tool_{len(defs)}"
        defs[key] = _rebase_refs(arguments, f"#/$defs/{key}")
        arguments = {"$ref": f"#/$defs/{key}"}
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_calls_grammar(tools: Sequence[tuple[str, Mapping[str, Any]]], mode: str, *, special_tags: bool,
                       answer: Mapping[str, Any] | None = None) -> str:
    """Qwen's tool-call blocks ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` as a grammar.

    Args:
        tools: ``(name, parameters schema)`` of each callable function.
        mode: where the grammar starts:
            ``"required"``: right after the prompt's ``<tool_call>\\n``: one or more calls, then the end;
            ``"named"``: right after ``... "arguments": `` of a single named call: its arguments, then the end;
            ``"auto"``: right after a ``<tool_call>`` the model wrote itself: ``\\n``, one call, the closing tag;
            ``"answer"``: from the first token: the ``answer`` schema's JSON, or one to :data:`MAX_CALLS` calls.
        special_tags: ``<tool_call>`` and ``</tool_call>`` are single special tokens (Qwen) rather than text.
        answer: with mode ``"answer"``, the response_format schema of a content answer.
    """
    tags = hermes.TAGS
    open_tag, close_tag = (tags.start, tags.end) if special_tags else (f'"{tags.start}"', f'"{tags.end}"')
    lines = ["%llguidance {}"]
    if mode == "named":
        (_, parameters), = tools
        lines += [f'start: args "}}" "\\n" {close_tag}', f"args: %json {_embedded(close_objects(parameters))}"]
        return llguidance.LLMatcher.grammar_from_lark("\n".join(lines))
    defs: dict = {}
    schemas = [tool_call_schema(name, parameters, defs) for name, parameters in tools]
    body = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if defs:
        body = {**body, "$defs": defs}
    call = f'body "\\n" {close_tag}'
    more = f'("\\n" {open_tag} "\\n" {call}){{0,{MAX_CALLS - 1}}}'
    if mode == "required":
        lines.append(f"start: {call} {more}")
    elif mode == "auto":
        lines.append(f'start: "\\n" {call}')
    elif mode == "answer":
        assert answer is not None
        lines += [f'start: answer | {open_tag} "\\n" {call} {more}', f"answer: %json {_embedded(close_objects(answer))}"]
    else:
        raise ValueError(f"unknown tool-call grammar mode {mode!r}")
    lines.append(f"body: %json {_embedded(body)}")
    return llguidance.LLMatcher.grammar_from_lark("\n".join(lines))


def _embedded(schema: Mapping[str, Any]) -> str:
    """A schema for Lark's inline ``%json``, with the JSON layout in its top-level ``x-guidance``."""
    return json.dumps({**schema, "x-guidance": JSON_LAYOUT}, ensure_ascii=False)


def close_objects(schema: Any, *, in_all_of: bool = False) -> Any:
    """A copy of ``schema`` made enforceable as the module doc says: objects closed, decimal places bounded.

    Every object listing ``properties`` without a rule for other keys is closed, except members of
    ``allOf`` (closing one would forbid the properties its siblings add).
    """
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "propertyNames" and value in (_ANY_KEY, {}, True):
            continue  # every object key is a string: it says nothing (module doc)
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: close_objects(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [close_objects(sub, in_all_of=key == "allOf") for sub in value]
        elif key in _SCHEMA_ONE:
            out[key] = close_objects(value)
        else:
            out[key] = value
    if "properties" in schema and not in_all_of and not any(key in schema for key in _OPEN_DECIDERS):
        out["additionalProperties"] = False
    kinds = schema.get("type")
    if (kinds == "number" or (isinstance(kinds, list) and "number" in kinds)) and "multipleOf" not in schema:
        out["multipleOf"] = 10.0 ** -MAX_DECIMALS
    return out


def _map_subschemas(schema: Any, change) -> Any:
    """``change(sub)`` applied to every subschema, bottom up (schema-aware: only subschema keywords are walked)."""
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _map_subschemas(sub, change) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_map_subschemas(sub, change) for sub in value]
        elif key in _SCHEMA_ONE:
            out[key] = _map_subschemas(value, change)
        else:
            out[key] = value
    return change(out)


def _has_local_refs(schema: Any) -> bool:
    return any(isinstance(sub.get("$ref"), str) and sub["$ref"].startswith("#") for _, sub in _subschemas(schema, ""))


def _rebase_refs(schema: Any, base: str) -> Any:
    """``schema`` with every local ``$ref`` (``#``, ``#/...``) pointing below ``base`` instead of the root."""
    def rebase(sub: dict) -> dict:
        ref = sub.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            sub["$ref"] = base + ref[1:]
        return sub

    return _map_subschemas(schema, rebase)


def _subschemas(schema: Any, path: str) -> Iterator[tuple[str, Mapping]]:
    """Every (sub)schema of ``schema`` with its dotted path, parents first."""
    if not isinstance(schema, Mapping):
        return
    yield path, schema
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            for name, sub in value.items():
                yield from _subschemas(sub, _join(_join(path, key), name))
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _subschemas(sub, f"{_join(path, key)}[{i}]")
        elif key in _SCHEMA_ONE:
            yield from _subschemas(value, _join(path, key))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def clean_message(message: str) -> str:
    """An llguidance error fit for a 400 body: no Rust panic text, backtrace or dumped grammar.

    A panic inside the compiler is its bug, not the client's: the body says so without the internals (the
    log has them). Otherwise the first lines, cut at a backtrace and at :data:`MAX_MESSAGE_CHARS`.
    """
    if "panicked at" in message or "PanicException" in message:
        return "the grammar compiler failed on it (an internal error)"
    for marker in ("<backtrace>", "stack backtrace:", "\nBacktrace", "\nCaused by"):
        message = message.split(marker, 1)[0]
    message = " ".join(message.split())
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "..."


def schema_error(message: str, schema: Any, param: str) -> BadRequestError:
    """A 400 for a schema llguidance refused, ``param`` pointing at the keyword it names when it names one.

    Args:
        message: llguidance's error (e.g. ``Unimplemented keys: ["uniqueItems"]``).
        schema: the schema as the request sent it.
        param: the request path of ``schema`` (``response_format.json_schema.schema``).
    """
    message = clean_message(message)
    keyword, value = _keyword_of(message)
    if keyword is not None:
        for path, sub in _subschemas(schema, param):
            if keyword in sub and (value is None or sub[keyword] == value):
                where = _join(path, keyword)
                if message.startswith(("Unimplemented keys", "Unknown format")):
                    text = (f"'{where}': the JSON Schema keyword '{keyword}'"
                            f"{f' value {value!r}' if value is not None else ''} is not supported by structured "
                            f"outputs ({message})")
                else:
                    text = f"'{where}': the schema cannot be used for structured outputs: {message}"
                return BadRequestError(text, param=where)
    return BadRequestError(f"'{param}': the schema cannot be used for structured outputs: {message}", param=param)


def _keyword_of(message: str) -> tuple[str | None, Any]:
    """The schema keyword (and value, for ``format``) an llguidance error message is about, if it names one."""
    if message.startswith("Unimplemented keys:"):
        try:
            keys = json.loads(message.split(":", 1)[1].strip().splitlines()[0])
            return (keys[0], None) if keys else (None, None)
        except (ValueError, IndexError):
            return None, None
    found = re.match(r"Unknown format: (.+)", message)
    if found:
        return "format", found.group(1).strip()
    if message.startswith("regex parse error"):
        return "pattern", None
    named = [(m.start(), k) for k in _KEYWORDS if (m := re.search(rf"(?<![\w$]){re.escape(k)}(?!\w)", message))]
    return (min(named)[1], None) if named else (None, None)
