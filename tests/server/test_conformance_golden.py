"""Golden transcripts: whole responses, byte for byte, after normalizing ids and timestamps.

The model is the demo model scripted as in test_tools.py, so the token
sequence does not depend on float details. Each SSE transcript is read with
the strict :func:`parse_sse` (and so is the golden file itself), then every
event is normalized and re-framed; the result must equal the golden file.

Regenerate after a deliberate change of the wire format with
``KESTREL_REGENERATE_GOLDEN=1 pytest tests/server/test_conformance_golden.py``
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from kestrel_trio.model import Model
from kestrel_trio.openai import parse_sse, sse_event, to_json_bytes

from server_kit import fetch, running_server
from test_tools import TOOLS, ScriptedModel

GOLDEN = Path(__file__).resolve().parent / "golden"
REGENERATE = os.environ.get("KESTREL_REGENERATE_GOLDEN") == "1"

CASES = {
    "chat_tool_call_stream.sse": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS, "stream": True,
        "stream_options": {"include_usage": True}}),
    "chat_tool_call.json": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS}),
    "chat_n2_stream.sse": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "GREET me"}], "n": 2, "stream": True,
        "stream_options": {"include_usage": True}}),
    "chat_tool_choice_none_stream.sse": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS, "tool_choice": "none",
        "stream": True}),
    "completion_echo_stream.sse": ("/v1/completions", {"prompt": "GREET:", "echo": True, "stream": True}),
}


def normalize(obj):
    """Replace what differs between runs: response ids, creation times, tool-call ids."""
    calls: dict[str, str] = {}

    def walk(value):
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if key == "id" and isinstance(item, str) and item.startswith("call_"):
                    out[key] = calls.setdefault(item, f"call_{len(calls)}")
                elif key == "id" and isinstance(item, str):
                    out[key] = item.split("-")[0] + "-ID"
                elif key == "created":
                    out[key] = 0
                else:
                    out[key] = walk(item)
            return out
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return walk(obj)


def transcript(name: str, body: bytes) -> bytes:
    if name.endswith(".json"):
        return to_json_bytes(normalize(json.loads(body))) + b"\n"
    events = []
    for payload in parse_sse(body):
        events.append(b"data: [DONE]\n\n" if payload == "[DONE]" else sse_event(normalize(json.loads(payload))))
    return b"".join(events)


@pytest.fixture
def scripted(demo_model: Model, monkeypatch: pytest.MonkeyPatch) -> ScriptedModel:
    return ScriptedModel(demo_model).install(monkeypatch)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_transcript_matches_the_golden_file(scripted: ScriptedModel, name: str) -> None:
    path, request = CASES[name]
    with trio.fail_after(60):
        async with running_server(scripted.model) as server:
            response = await fetch(server.port, "POST", path, {"model": server.state.model_id, **request})
    assert response.status == 200, response.body
    got = transcript(name, response.body)
    golden = GOLDEN / name
    if REGENERATE:
        golden.write_bytes(got)
    expected = golden.read_bytes()
    if name.endswith(".sse"):
        parse_sse(expected)  # the golden file itself is strict SSE
        assert response.headers["content-type"].startswith("text/event-stream")
    assert got.decode() == expected.decode()
