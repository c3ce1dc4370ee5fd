"""The official openai client against the server, on the fixture checkpoint and on the demo model.

The client is synchronous, so each test runs it in a worker thread while the
server runs in the test's trio loop.
"""

from __future__ import annotations

import openai
import pytest
import trio

from kestrel_trio.model import Model

from server_kit import assert_envelope, client_for, fetch, greedy_tokens, running_server

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three rivers."}]
PROMPT = "The three longest rivers are"
MAX_TOKENS = 12


def greedy_oracle(model: Model, prompt_ids: list[int], max_tokens: int) -> tuple[str, str, int]:
    """(text, finish_reason, completion_tokens) of a greedy generation, straight from the model."""
    ids = greedy_tokens(model, prompt_ids, max_tokens)
    eos = model.tokenizer.eos_token_ids
    for index, token in enumerate(ids):
        if token in eos:
            return model.decode(ids[:index]), "stop", index + 1
    return model.decode(ids), "length", len(ids)


def chunk_text(chunks: list, field: str) -> str:
    return "".join(getattr(c.choices[0].delta, field, None) or "" for c in chunks if c.choices)


async def test_chat_streamed_equals_non_streamed_and_usage_adds_up(model: Model) -> None:
    with trio.fail_after(30):
        async with running_server(model) as server:
            tokens = server.engine.metrics.generation_tokens

            def run():
                with client_for(server) as client:
                    before = tokens.value()
                    full = client.chat.completions.create(
                        model=server.state.model_id, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS
                    )
                    generated = tokens.value() - before
                    stream = client.chat.completions.create(
                        model=server.state.model_id, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS,
                        stream=True, stream_options={"include_usage": True},
                    )
                    return full, generated, list(stream)

            full, generated, chunks = await trio.to_thread.run_sync(run)
            counted = (await fetch(server.port, "POST", "/tokenize", {"messages": MESSAGES})).json()["count"]

    message = full.choices[0].message
    assert chunk_text(chunks, "content") == (message.content or "")
    assert chunk_text(chunks, "reasoning_content") == (getattr(message, "reasoning_content", None) or "")
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        full.choices[0].finish_reason
    ]

    usage = full.usage
    assert usage.prompt_tokens == counted
    assert usage.completion_tokens == generated >= 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if full.choices[0].finish_reason == "length":
        assert usage.completion_tokens == MAX_TOKENS

    *body, last = chunks
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None for c in body)
    same_counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(last.usage, key) for key in same_counts] == [getattr(usage, key) for key in same_counts]
    # The streamed request came second with the same prompt: all of it but the last token came from the prefix cache.
    assert (usage.prompt_tokens_details.cached_tokens, last.usage.prompt_tokens_details.cached_tokens) == (
        0, counted - 1)


async def test_completion_matches_the_model_streamed_or_not(model: Model) -> None:
    text, finish_reason, completion_tokens = greedy_oracle(model, model.encode(PROMPT), MAX_TOKENS)
    assert finish_reason == "length", "the prompt was chosen so that greedy decoding hits no EOS"
    with trio.fail_after(30):
        async with running_server(model) as server:

            def run():
                with client_for(server) as client:
                    full = client.completions.create(
                        model=server.state.model_id, prompt=PROMPT, temperature=0, max_tokens=MAX_TOKENS
                    )
                    stream = client.completions.create(
                        model=server.state.model_id, prompt=PROMPT, temperature=0, max_tokens=MAX_TOKENS, stream=True
                    )
                    return full, list(stream)

            full, chunks = await trio.to_thread.run_sync(run)
            counted = (await fetch(server.port, "POST", "/tokenize", {"prompt": PROMPT})).json()["count"]

    assert full.choices[0].text == text
    assert full.choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert [c for c in chunks if c.choices[0].finish_reason] == [chunks[-1]]
    # Without stream_options.include_usage: no usage chunk at all.
    assert all(c.choices and c.usage is None for c in chunks)
    assert full.usage.prompt_tokens == counted == len(model.encode(PROMPT))
    assert full.usage.completion_tokens == completion_tokens == MAX_TOKENS
    assert full.usage.total_tokens == counted + MAX_TOKENS


async def test_completion_stream_with_usage_ends_with_a_usage_chunk(model: Model) -> None:
    with trio.fail_after(30):
        async with running_server(model) as server:

            def run():
                with client_for(server) as client:
                    return list(client.completions.create(
                        model=server.state.model_id, prompt=PROMPT, temperature=0, max_tokens=3, stream=True,
                        stream_options={"include_usage": True},
                    ))

            chunks = await trio.to_thread.run_sync(run)
    *body, last = chunks
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(model.encode(PROMPT)), 3)
    assert last.usage.total_tokens == last.usage.prompt_tokens + 3
    assert body and all(c.choices and c.usage is None for c in body)


def pick_stop_string(text: str) -> str:
    """A two-character piece from the middle of ``text`` (no U+FFFD), so output must stop before it."""
    for start in range(len(text) // 3, len(text) - 1):
        piece = text[start : start + 2]
        if "\ufffd" not in piece and piece.strip():
            return piece
    raise AssertionError(f"no usable stop string in {text!r}")


async def test_a_stop_string_never_appears_in_the_output(model: Model) -> None:
    with trio.fail_after(30):
        async with running_server(model) as server:

            def run():
                with client_for(server) as client:
                    plain = client.completions.create(
                        model=server.state.model_id, prompt=PROMPT, temperature=0, max_tokens=24
                    ).choices[0].text
                    stop = pick_stop_string(plain)
                    kwargs = dict(
                        model=server.state.model_id, prompt=PROMPT, temperature=0, max_tokens=24, stop=[stop]
                    )
                    full = client.completions.create(**kwargs)
                    streamed = list(client.completions.create(stream=True, **kwargs))
                    chat = client.chat.completions.create(
                        model=server.state.model_id, messages=MESSAGES, temperature=0, max_tokens=24, stop=stop
                    )
                    return plain, stop, full, streamed, chat

            plain, stop, full, streamed, chat = await trio.to_thread.run_sync(run)

    expected = plain[: plain.index(stop)]
    assert full.choices[0].text == expected
    assert full.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"
    assert stop not in (chat.choices[0].message.content or "")


async def test_models_list_and_a_wrong_model_name(model: Model) -> None:
    with trio.fail_after(30):
        async with running_server(model) as server:

            def run():
                with client_for(server) as client:
                    listed = [m.id for m in client.models.list()]
                    with pytest.raises(openai.NotFoundError) as chat_error:
                        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=2)
                    with pytest.raises(openai.NotFoundError) as completion_error:
                        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2, stream=True)
                    return listed, chat_error.value, completion_error.value

            listed, chat_error, completion_error = await trio.to_thread.run_sync(run)
    assert listed == [model.name]
    for error in (chat_error, completion_error):
        assert error.status_code == 404
        assert error.body["param"] == "model"
        assert "no-such-model" in error.body["message"]


def too_long_text(model: Model) -> str:
    text = "river " * (model.context_length + 16)
    assert len(model.encode(text)) > model.context_length
    return text


async def test_a_prompt_longer_than_the_context_is_refused_before_streaming(model: Model) -> None:
    text = too_long_text(model)
    chat_body = {"model": model.name, "messages": [{"role": "user", "content": text}], "stream": True}
    completion_body = {"model": model.name, "prompt": text, "stream": True, "max_tokens": 4}
    with trio.fail_after(30):
        async with running_server(model) as server:

            def run():
                with client_for(server) as client:
                    with pytest.raises(openai.BadRequestError) as error:
                        client.chat.completions.create(model=model.name, messages=chat_body["messages"], stream=True)
                    return error.value

            client_error = await trio.to_thread.run_sync(run)
            raw = [
                await fetch(server.port, "POST", "/v1/chat/completions", chat_body),
                await fetch(server.port, "POST", "/v1/completions", completion_body),
            ]
            assert server.engine.metrics.steps.value() == 0

    assert client_error.status_code == 400 and client_error.body["param"] == "messages"
    for response, field in zip(raw, ("messages", "prompt")):
        assert response.raw.startswith(b"HTTP/1.1 400 ")
        assert b"text/event-stream" not in response.raw
        error = assert_envelope(response, 400)
        assert error["param"] == field
        assert error["code"] == "context_length_exceeded"
        assert str(model.context_length) in error["message"]


async def test_max_tokens_past_the_context_names_max_tokens(model: Model) -> None:
    body = {"model": model.name, "prompt": PROMPT, "max_tokens": model.context_length, "stream": True}
    with trio.fail_after(30):
        async with running_server(model) as server:
            response = await fetch(server.port, "POST", "/v1/completions", body)
    assert response.raw.startswith(b"HTTP/1.1 400 ")
    assert assert_envelope(response, 400)["param"] == "max_tokens"
