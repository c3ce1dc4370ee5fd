"""The official ollama client against the server's Ollama API, on the demo model.

Random weights never write what a test needs, so the answers are scripted as in test_anthropic_client.py:
the real forward pass runs, then the scripted next token is made to win by a wide logit margin before the
real sampler (and any grammar mask) sees the logits. Everything downstream (sampling, detokenization, the
engine, the routes, HTTP, NDJSON) is the real code. The client is synchronous: it runs in a worker thread
while the server runs in the test's trio loop.
"""

from __future__ import annotations

import json

import numpy as np
import ollama
import pytest
import trio

from kestrel_trio.model import Model
from kestrel_trio.server import Server

from server_kit import HOST, ScriptedModel, client_for, fetch, in_worker, running_server
from slow_host import allowance

HELLO = "Hello there, traveller!"
THOUGHT = "The user greets me."
ANSWER = "It is 18 degrees and clear in Oslo."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
JSON_ANSWER = '{"city": "Oslo", "degrees": 18}'
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}},
          "required": ["city", "degrees"]}
GREETING = [{"role": "user", "content": "Say hello."}]
QUESTION = [{"role": "user", "content": "Weather in Oslo?"}]


def script(prompt: str) -> str:
    """What the scripted model answers to a rendered prompt."""
    if "<tool_response>" in prompt:
        return ANSWER
    if "<tools>" in prompt:
        return CALL
    if "Answer in JSON" in prompt:
        return JSON_ANSWER
    if prompt.endswith("<|im_start|>assistant\n"):  # thinking left to the model (enable_thinking true)
        return f"<think>\n{THOUGHT}\n</think>\n\n{HELLO}"
    return HELLO


@pytest.fixture
def scripted(demo_model: Model, monkeypatch: pytest.MonkeyPatch) -> Model:
    return ScriptedModel(demo_model, script).install(monkeypatch).model


async def with_client(server: Server, work):
    """``work(client, model_name)`` in a worker thread, with an ollama client pointed at ``server``."""
    return await in_worker(lambda: ollama.Client(host=f"http://{HOST}:{server.port}", timeout=allowance(30)), work,
                           server.state.model_id + ":latest")


FINAL_FIELDS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
                "eval_duration")


async def test_chat_whole_and_streamed_agree_with_ollamas_final_fields(scripted) -> None:
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            def work(client, name):
                whole = client.chat(model=name, messages=GREETING, think=False, options={"temperature": 0})
                parts = list(client.chat(model=name, messages=GREETING, think=False, stream=True))
                return whole, parts

            whole, parts = await with_client(server, work)
            raw = await fetch(server.port, "POST", "/api/chat",
                              {"model": server.state.model_id, "messages": GREETING, "think": False})
    assert whole.message.role == "assistant" and whole.message.content == HELLO and not whole.message.thinking
    assert whole.done and whole.done_reason == "stop"
    assert whole.eval_count == len(scripted.encode(HELLO)) + 1  # + EOS
    assert whole.prompt_eval_count > 0 and whole.load_duration == 0
    assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration > 0  # nanoseconds
    assert "".join(part.message.content for part in parts) == HELLO
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == whole.eval_count
    # Streaming is the default: NDJSON lines, each one JSON object, the statistics on the last only.
    assert raw.status == 200 and raw.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in raw.body.decode().splitlines()]
    assert raw.body.endswith(b"\n") and len(lines) >= 2
    assert all(set(FINAL_FIELDS).isdisjoint(line) for line in lines[:-1])
    assert set(FINAL_FIELDS) <= set(lines[-1]) and lines[-1]["done"] is True
    assert all(line["model"] == server.state.model_id and line["created_at"].endswith("Z") for line in lines)


async def test_think_on_gives_the_thinking_field_and_off_gives_none(scripted) -> None:
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            def work(client, name):
                on = client.chat(model=name, messages=GREETING, think=True)
                streamed = list(client.chat(model=name, messages=GREETING, think=True, stream=True))
                off = client.chat(model=name, messages=GREETING, think=False)
                generated = client.generate(model=name, prompt="Say hello.", think=True)
                return on, streamed, off, generated

            on, streamed, off, generated = await with_client(server, work)
    assert on.message.thinking.strip() == THOUGHT and on.message.content == HELLO
    assert "".join(p.message.thinking or "" for p in streamed).strip() == THOUGHT
    assert "".join(p.message.content for p in streamed) == HELLO
    assert off.message.thinking is None and off.message.content == HELLO
    assert generated.thinking.strip() == THOUGHT and generated.response == HELLO


async def test_a_tool_call_round_trip_in_ollamas_shape(scripted) -> None:
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            def work(client, name):
                first = client.chat(model=name, messages=QUESTION, tools=TOOLS, think=False)
                calls = first.message.tool_calls
                history = QUESTION + [first.message, {"role": "tool", "tool_name": "get_weather",
                                                      "content": '{"degrees": 18, "sky": "clear"}'}]
                second = client.chat(model=name, messages=history, tools=TOOLS, think=False)
                streamed = list(client.chat(model=name, messages=QUESTION, tools=TOOLS, think=False, stream=True))
                return calls, second, streamed

            calls, second, streamed = await with_client(server, work)
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == {"city": "Oslo"}  # an object, as Ollama sends it
    assert second.message.content == ANSWER and not second.message.tool_calls
    streamed_calls = [call for part in streamed for call in (part.message.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in streamed_calls] == [("get_weather", {"city": "Oslo"})]
    assert streamed[-1].done_reason == "stop"


async def test_format_json_schema_and_generate(scripted) -> None:
    system = "Answer in JSON."
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            def work(client, name):
                schema = client.chat(model=name, format=SCHEMA, think=False,
                                     messages=[{"role": "system", "content": system}] + QUESTION)
                plain = client.generate(model=name, prompt="Weather?", system=system, format="json", think=False)
                streamed = list(client.generate(model=name, prompt="Say hello.", think=False, stream=True,
                                                options={"num_predict": 3, "seed": 1, "stop": ["zzz"]}))
                loaded = client.generate(model=name)  # no prompt: Ollama's "load the model" call
                chat_loaded = client.chat(model=name, messages=[])  # likewise
                return schema, plain, streamed, loaded, chat_loaded

            schema, plain, streamed, loaded, chat_loaded = await with_client(server, work)
    assert json.loads(schema.message.content) == {"city": "Oslo", "degrees": 18}
    assert json.loads(plain.response) == {"city": "Oslo", "degrees": 18}
    assert streamed[-1].done and streamed[-1].done_reason == "length" and streamed[-1].eval_count == 3
    assert "".join(part.response for part in streamed) == scripted.decode(scripted.encode(HELLO)[:3])
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert chat_loaded.done_reason == "load" and chat_loaded.message.content == ""


async def test_the_listings_describe_the_served_model(demo_model: Model) -> None:
    with trio.fail_after(allowance(90)):
        async with running_server(demo_model) as server:
            def work(client, name):
                return client.list(), client.show(name), client.ps()

            listed, shown, running = await with_client(server, work)
            version = await fetch(server.port, "GET", "/api/version")
    name = server.state.model_id + ":latest"
    [entry] = listed.models
    assert entry.model == name and entry.details.family == "qwen3" and entry.details.quantization_level == "F32"
    assert entry.details.parameter_size.endswith("M")
    assert shown.capabilities == ["completion", "tools", "thinking"]  # not an embedding checkpoint, no vision
    assert shown.modelinfo["qwen3.context_length"] == demo_model.context_length
    assert shown.modelinfo["qwen3.embedding_length"] == demo_model.config.hidden_size
    assert shown.template == demo_model.tokenizer.chat_template
    [loaded] = running.models
    assert loaded.model == name and loaded.size_vram == 0
    assert version.status == 200 and version.json()["version"].count(".") == 2


async def test_embed_matches_v1_embeddings(demo_model: Model) -> None:
    texts = ["The cat sat on the mat.", "Ein Hund bellt."]
    with trio.fail_after(allowance(90)):
        async with running_server(demo_model) as server:
            def work(client, name):
                embedded = client.embed(model=name, input=texts)
                one = client.embed(model=name, input=texts[0], dimensions=8)
                legacy = client.embeddings(model=name, prompt=texts[1])
                with client_for(server) as openai_client:
                    reference = openai_client.embeddings.create(model=server.state.model_id, input=texts,
                                                                encoding_format="float")
                return embedded, one, legacy, reference

            embedded, one, legacy, reference = await with_client(server, work)
    want = np.asarray([item.embedding for item in reference.data])  # [2, 64]
    assert np.allclose(np.asarray(embedded.embeddings), want, atol=1e-6)
    assert embedded.prompt_eval_count == reference.usage.prompt_tokens
    assert np.allclose(one.embeddings[0], want[0, :8] / np.linalg.norm(want[0, :8]), atol=1e-6)
    assert np.allclose(legacy.embedding, want[1], atol=1e-6)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/api/pull", {"model": "llama3"}), ("POST", "/api/push", {"model": "x"}),
    ("POST", "/api/create", {"model": "x", "from": "y"}), ("POST", "/api/copy", {"source": "a", "destination": "b"}),
    ("DELETE", "/api/delete", {"model": "x"}), ("POST", "/api/blobs/sha256:00", None),
    ("HEAD", "/api/blobs/sha256:00", None),
])
async def test_the_model_store_routes_are_refused_in_ollamas_shape(demo_model: Model, method, path, body) -> None:
    with trio.fail_after(allowance(60)):
        async with running_server(demo_model) as server:
            response = await fetch(server.port, method, path, body)
    assert response.status == 400
    if method != "HEAD":  # a HEAD answer has no body
        assert response.json().keys() == {"error"}
        assert "not supported" in response.json()["error"] and "kestrel-trio serve" in response.json()["error"]


async def test_refusals_name_the_problem(demo_model: Model) -> None:
    with trio.fail_after(allowance(90)):
        async with running_server(demo_model) as server:
            def work(client, name):
                errors = {}
                for label, call in {
                    "pull": lambda: client.pull("llama3"),
                    "model": lambda: client.chat(model="llama3", messages=GREETING),
                    "mirostat": lambda: client.chat(model=name, messages=GREETING, options={"mirostat": 2}),
                    "option": lambda: client.generate(model=name, prompt="x", options={"temprature": 0.1}),
                    "suffix": lambda: client.generate(model=name, prompt="x", suffix="y"),
                    "think": lambda: client.chat(model=name, messages=GREETING, think="max"),
                }.items():
                    with pytest.raises(ollama.ResponseError) as caught:
                        call()
                    errors[label] = (caught.value.status_code, caught.value.error)
                # runtime options fixed at start are accepted (documented no-ops)
                accepted = client.generate(model=name, prompt="x", options={"num_ctx": 4096, "num_thread": 2,
                                                                              "num_predict": 1})
                return errors, accepted

            errors, accepted = await with_client(server, work)
            unknown = await fetch(server.port, "GET", "/api/nothing")
            not_json = await fetch(server.port, "POST", "/api/chat", None, content_type="text/plain")
    assert errors["pull"][0] == 400 and "/api/pull is not supported" in errors["pull"][1]
    assert errors["model"][0] == 404 and "'llama3' not found" in errors["model"][1]
    assert errors["mirostat"][0] == 400 and "options.mirostat" in errors["mirostat"][1]
    assert errors["option"][0] == 400 and "options.temprature" in errors["option"][1]
    assert errors["suffix"][0] == 400 and "suffix" in errors["suffix"][1]
    assert errors["think"][0] == 400 and "think" in errors["think"][1]
    assert accepted.done_reason == "length" and accepted.eval_count == 1
    assert unknown.status == 404 and unknown.json().keys() == {"error"}
    assert not_json.status == 415 and not_json.json().keys() == {"error"}


async def test_an_api_key_is_asked_for_in_ollamas_shape(demo_model: Model) -> None:
    with trio.fail_after(allowance(60)):
        async with running_server(demo_model, api_key="sk-ollama") as server:
            refused = await fetch(server.port, "GET", "/api/tags")

            def work():
                with ollama.Client(host=f"http://{HOST}:{server.port}", timeout=allowance(30),
                                   headers={"Authorization": "Bearer sk-ollama"}) as client:
                    return client.list()

            listed = await trio.to_thread.run_sync(work)
    assert refused.status == 401 and "API key" in refused.json()["error"]
    assert len(listed.models) == 1


def fold(lines: list[dict]) -> list[tuple]:
    """The stream's lines as (kind, text) runs: consecutive lines of the same kind joined, the last one whole."""
    runs: list[tuple] = []
    for line in lines[:-1]:
        message = line["message"]
        assert set(message) <= {"role", "content", "thinking", "tool_calls"} and message["role"] == "assistant"
        for kind in ("thinking", "content"):
            if message.get(kind):
                if runs and runs[-1][0] == kind:
                    runs[-1] = (kind, runs[-1][1] + message[kind])
                else:
                    runs.append((kind, message[kind]))
        for call in message.get("tool_calls", ()):
            runs.append(("tool_call", call["function"]["name"], call["function"]["arguments"]))
    return runs


async def test_the_ndjson_sequence_of_a_streamed_answer_is_ollamas(scripted) -> None:
    """Golden: the raw lines off the socket, for reasoning then an answer, and for a tool call."""
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            model_id = server.state.model_id
            answer = await fetch(server.port, "POST", "/api/chat",
                                 {"model": model_id, "messages": GREETING, "think": True})
            call = await fetch(server.port, "POST", "/api/chat",
                               {"model": model_id, "messages": QUESTION, "tools": TOOLS, "think": False})
    answer_lines = [json.loads(line) for line in answer.body.decode().splitlines()]
    call_lines = [json.loads(line) for line in call.body.decode().splitlines()]
    assert fold(answer_lines) == [("thinking", f"{THOUGHT}\n"), ("content", HELLO)]
    assert fold(call_lines) == [("tool_call", "get_weather", {"city": "Oslo"})]
    for lines in (answer_lines, call_lines):
        last = lines[-1]
        assert last["message"] == {"role": "assistant", "content": ""}
        assert last["done"] is True and last["done_reason"] == "stop"
        assert list(last) == ["model", "created_at", "message", "done", "done_reason", *FINAL_FIELDS]
        assert all(list(line) == ["model", "created_at", "message", "done"] for line in lines[:-1])


async def test_a_tool_call_cut_off_inside_its_arguments_comes_back_as_its_text(scripted) -> None:
    """num_predict ends the call mid-arguments: no object to send as arguments, so the text the model wrote."""
    with trio.fail_after(allowance(90)):
        async with running_server(scripted) as server:
            model_id = server.state.model_id
            body = {"model": model_id, "messages": QUESTION, "tools": TOOLS, "think": False,
                    "options": {"num_predict": 17}}
            streamed = await fetch(server.port, "POST", "/api/chat", body)
            whole = await fetch(server.port, "POST", "/api/chat", {**body, "stream": False})
    lines = [json.loads(line) for line in streamed.body.decode().splitlines()]
    text = "".join(line["message"]["content"] for line in lines)
    assert streamed.status == 200 and whole.status == 200
    assert CALL.startswith(text) and '"arguments": {"' in text and not text.endswith("}")  # cut inside arguments
    assert not any(line["message"].get("tool_calls") for line in lines)
    assert lines[-1]["done_reason"] == "length" and lines[-1]["message"]["content"] == ""
    assert whole.json()["message"] == {"role": "assistant", "content": text}
