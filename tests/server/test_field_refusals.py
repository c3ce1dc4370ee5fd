"""No request field silently ignored, over real sockets and through the official client."""

from __future__ import annotations

import openai
import pytest
import trio

from kestrel_trio.model import Model

from server_kit import assert_envelope, client_for, fetch, running_server

MESSAGES = [{"role": "user", "content": "Hi"}]
CHAT = {"messages": MESSAGES, "max_tokens": 2, "temperature": 0}


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object", "strict": True}},
     "response_format.strict"),
    ("/v1/chat/completions", {**CHAT, "frobnicate": True}, "frobnicate"),
    ("/v1/chat/completions", {**CHAT, "messages": [{**MESSAGES[0], "weight": 2}]}, "messages[0].weight"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"enable_thinkin": False}},
     "chat_template_kwargs.enable_thinkin"),
    ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True, "x": 1}},
     "stream_options.x"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "max_completion_tokens": 2}, "max_completion_tokens"),
    ("/tokenize", {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinkin": False}},
     "chat_template_kwargs.enable_thinkin"),
    ("/tokenize", {"prompt": "Hi", "add_special_tokens": False}, "add_special_tokens"),
])
async def test_a_field_that_would_be_ignored_is_a_400_naming_it_before_any_work(
    demo_model: Model, path: str, body: dict, param: str,
) -> None:
    with trio.fail_after(30):
        async with running_server(demo_model) as server:
            response = await fetch(server.port, "POST", path, body)
            accepted = server.engine.metrics.accepted.value()
    error = assert_envelope(response, 400)
    assert error["param"] == param and param.rpartition(".")[2] in error["message"]
    assert accepted == 0


async def test_the_official_client_sees_the_refusal_and_the_no_ops_pass(demo_model: Model) -> None:
    def work(server):
        with client_for(server) as client:
            with pytest.raises(openai.BadRequestError) as structured:
                client.chat.completions.create(model=server.state.model_id, messages=MESSAGES, max_tokens=2,
                                               response_format={"type": "json_schema", "json_schema": {
                                                   "name": "a", "schema": {"type": "object"}, "strcit": True}})
            with pytest.raises(openai.BadRequestError) as unknown:
                client.chat.completions.create(model=server.state.model_id, messages=MESSAGES, max_tokens=2,
                                               extra_body={"guided_json": {"type": "object"}})
            accepted = client.chat.completions.create(
                model=server.state.model_id, messages=[{**MESSAGES[0], "name": "alice"}], max_tokens=2,
                temperature=0, user="u-1", store=False, metadata={"run": "1"}, service_tier="auto",
                response_format={"type": "text"}, safety_identifier="h", prompt_cache_key="k")
            plain = client.chat.completions.create(model=server.state.model_id, messages=MESSAGES, max_tokens=2,
                                                   temperature=0)
            return structured.value, unknown.value, accepted, plain

    with trio.fail_after(60):
        async with running_server(demo_model) as server:
            structured, unknown, accepted, plain = await trio.to_thread.run_sync(work, server)
    assert structured.status_code == 400 and structured.body["param"] == "response_format.json_schema.strcit"
    assert "Unrecognized" in structured.body["message"]
    assert unknown.body["param"] == "guided_json" and "structured_outputs.json" in unknown.body["message"]
    assert accepted.choices[0].message.content == plain.choices[0].message.content  # the no-ops changed nothing
