"""Response bodies checked against the committed extract of OpenAI's OpenAPI spec (tests/fixtures/openai_spec).

``violations(kind, obj)`` lists every place ``obj`` breaks the spec's component ``kind`` (``chat_completion``,
``chat_completion_chunk``, ``completion``, ``completion_chunk``, ``model``, ``model_list``, ``error``), each as
``path: message``; ``sse_violations`` does the same for every event of an SSE body (an ``{"error": ...}``
event is checked as an error). The spec itself cannot be fetched in tests (only package registries are
reachable), hence the extract, whose header names the spec version it was written from.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from kestrel_trio.openai import parse_sse

SCHEMA_FILE = Path(__file__).resolve().parent / "fixtures" / "openai_spec" / "responses.schema.json"
_SCHEMA = json.loads(SCHEMA_FILE.read_text())
_VALIDATORS = {kind: jsonschema.Draft202012Validator({**_SCHEMA, "$ref": f"#/$defs/{kind}"})
               for kind in _SCHEMA["$defs"]}


def violations(kind: str, obj: object) -> list[str]:
    """Every violation of the spec's ``kind`` by ``obj`` (empty when it conforms)."""
    errors = _VALIDATORS[kind].iter_errors(obj)
    return [f"{'/'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}" for error in errors]


def sse_violations(kind: str, body: bytes) -> list[str]:
    """Every violation in an SSE body's events (each against ``kind``, error events against ``error``)."""
    found = []
    for number, payload in enumerate(parse_sse(body)):
        if payload == "[DONE]":
            continue
        event = json.loads(payload)
        which = "error" if "error" in event else kind
        found += [f"event {number}: {message}" for message in violations(which, event)]
    return found
