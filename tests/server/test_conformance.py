"""Conformance with the official openai client: logprobs, n > 1, usage, refusals, an error mid-stream.

Run on the fixture checkpoint and on the demo model. Expected values come from
the model itself (a greedy reference and its log-softmax), not from the server.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import trio

from kestrel_trio.engine import EngineLimits
from kestrel_trio.model import Model
from kestrel_trio.openai import parse_sse
from kestrel_trio.server import Server

from server_kit import (
    StepGate, assert_envelope, client_for, connected, fetch, greedy_tokens, running_server, wait_until,
)

MESSAGES = [{"role": "user", "content": "Name three rivers."}]
PROMPT = "The three longest rivers are"
MAX_TOKENS = 6


async def with_client(server: Server, work):
    def run():
        with client_for(server) as client:
            return work(client, server.state.model_id)

    return await trio.to_thread.run_sync(run)


def first_step_logprobs(model: Model, prompt_ids: list[int]) -> np.ndarray:
    """log-softmax [vocab] of the first generated position, over real tokens only."""
    usable = min(model.config.vocab_size, model.require_tokenizer().vocab_size)
    logits = model.prefill(model.new_cache(), prompt_ids)[:usable].astype(np.float64)  # [usable]
    return logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())


async def test_completion_logprobs_match_the_model_streamed_or_not(model: Model) -> None:
    prompt_ids = model.encode(PROMPT)
    expected = greedy_tokens(model, prompt_ids, MAX_TOKENS)
    reference = first_step_logprobs(model, prompt_ids)
    request = dict(prompt=PROMPT, temperature=0, max_tokens=MAX_TOKENS, logprobs=2, ignore_eos=True)
    with trio.fail_after(60):
        async with running_server(model) as server:
            full, chunks = await with_client(server, lambda c, m: (
                c.completions.create(model=m, **_extra(request)),
                list(c.completions.create(model=m, stream=True, **_extra(request)))))
    logprobs = full.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == MAX_TOKENS == full.usage.completion_tokens
    assert logprobs.token_logprobs[0] == pytest.approx(reference[expected[0]], abs=2e-3)
    assert sorted(logprobs.top_logprobs[0].values(), reverse=True) == pytest.approx(
        np.sort(reference)[::-1][:2].tolist(), abs=2e-3)
    for top, chosen, value in zip(logprobs.top_logprobs, logprobs.tokens, logprobs.token_logprobs):
        assert len(top) == 2 and top[chosen] == value == max(top.values())  # greedy: the chosen is the best
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs and c.choices[0].logprobs.tokens]
    assert [t for lp in streamed for t in lp.tokens] == logprobs.tokens
    assert [o for lp in streamed for o in lp.text_offset] == logprobs.text_offset


def _extra(request: dict) -> dict:
    """Move non-OpenAI fields into extra_body, as a client must."""
    body = dict(request)
    extra = {key: body.pop(key) for key in ("ignore_eos",) if key in body}
    return {**body, "extra_body": extra} if extra else body


async def test_chat_logprobs_match_the_model_streamed_or_not(model: Model) -> None:
    request = dict(messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS, logprobs=True, top_logprobs=3,
                   ignore_eos=True)
    with trio.fail_after(60):
        async with running_server(model) as server:
            prompt_ids = (await fetch(server.port, "POST", "/tokenize", {"messages": MESSAGES})).json()["tokens"]
            full, chunks = await with_client(server, lambda c, m: (
                c.chat.completions.create(model=m, **_extra(request)),
                list(c.chat.completions.create(model=m, stream=True, **_extra(request)))))
    reference = first_step_logprobs(model, prompt_ids)
    content = full.choices[0].logprobs.content
    assert len(content) == MAX_TOKENS == full.usage.completion_tokens
    first = content[0]
    best = int(np.argmax(reference))
    assert first.logprob == pytest.approx(reference[best], abs=2e-3)
    assert bytes(first.bytes) == model.require_tokenizer().token_bytes(best)
    assert [round(t.logprob, 3) for t in first.top_logprobs] == [round(v, 3) for v in np.sort(reference)[::-1][:3]]
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].logprob == entry.logprob <= 0
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    # Tokens equal; values to float noise (the second request may reuse the first's prompt KV).
    assert [(e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in streamed] == [
        (e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-4)


async def test_n_greedy_choices_are_equal_and_usage_counts_the_prompt_once(model: Model) -> None:
    request = dict(messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS)
    with trio.fail_after(60):
        async with running_server(model) as server:
            one, three, chunks = await with_client(server, lambda c, m: (
                c.chat.completions.create(model=m, **request),
                c.chat.completions.create(model=m, n=3, **request),
                list(c.chat.completions.create(model=m, n=3, stream=True, stream_options={"include_usage": True},
                                               **request))))
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert {c.message.content for c in three.choices} == {one.choices[0].message.content}
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    *body, last = chunks
    assert last.choices == [] and last.usage.model_dump() == three.usage.model_dump()
    assert all(len(c.choices) == 1 and c.usage is None for c in body)
    for index in range(3):
        mine = [c.choices[0] for c in body if c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == three.choices[index].message.content
        assert [c.finish_reason for c in mine if c.finish_reason] == [three.choices[index].finish_reason]


async def test_n_seeded_choices_use_seed_plus_index(model: Model) -> None:
    request = dict(prompt=PROMPT, temperature=1.0, max_tokens=MAX_TOKENS)
    with trio.fail_after(60):
        async with running_server(model) as server:
            both, first, second, streamed = await with_client(server, lambda c, m: (
                c.completions.create(model=m, n=2, seed=7, **request),
                c.completions.create(model=m, seed=7, **request),
                c.completions.create(model=m, seed=8, **request),
                list(c.completions.create(model=m, n=2, seed=7, stream=True, **request))))
    assert [c.text for c in both.choices] == [first.choices[0].text, second.choices[0].text]
    assert both.usage.completion_tokens == first.usage.completion_tokens + second.usage.completion_tokens
    for index in range(2):
        text = "".join(c.choices[0].text for c in streamed if c.choices[0].index == index)
        assert text == both.choices[index].text
    assert all(c.usage is None for c in streamed)  # no include_usage: no usage anywhere


async def test_n_is_bounded_with_a_400_naming_n(model: Model) -> None:
    with trio.fail_after(60):
        async with running_server(model, engine_limits=EngineLimits(max_queued=2)) as server:
            over_max = await fetch(server.port, "POST", "/v1/chat/completions",
                                   {"messages": MESSAGES, "n": 9, "max_tokens": 2})
            over_queue = await fetch(server.port, "POST", "/v1/completions", {"prompt": PROMPT, "n": 3, "max_tokens": 2})
            steps = server.engine.metrics.steps.value()
    assert assert_envelope(over_max, 400)["param"] == "n"
    error = assert_envelope(over_queue, 400)
    assert error["param"] == "n" and "2" in error["message"]
    assert steps == 0


async def test_n_that_the_queue_cannot_hold_is_refused_whole(tiny_model: Model, gate: StepGate) -> None:
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    with trio.fail_after(30):
        async with running_server(tiny_model, engine_limits=EngineLimits(max_queued=2, max_batch=1)) as server:
            engine = server.engine
            async with connected(server.port) as active, connected(server.port) as waiting:
                with gate.held():
                    await active.send_request("POST", "/v1/completions", json.dumps({**body, "stream": True}).encode())
                    await gate.until_blocked()
                    await waiting.send_request("POST", "/v1/completions", json.dumps(body).encode())
                    await wait_until(lambda: engine.queued == 1)
                    refused = await fetch(server.port, "POST", "/v1/completions", {**body, "n": 2})
                    assert engine.queued == 1  # nothing of the refused request was left queued
                served = [await active.read_response(), await waiting.read_response()]
    error = assert_envelope(refused, 429)
    assert error["code"] == "queue_full" and int(refused.headers["retry-after"]) >= 1
    assert [r.status for r in served] == [200, 200]


async def test_an_error_mid_stream_ends_every_choice_with_one_error_event(tiny_model: Model, gate: StepGate) -> None:
    body = {"messages": MESSAGES, "max_tokens": 50, "n": 2, "ignore_eos": True, "stream": True, "logprobs": True}
    with trio.fail_after(30):
        async with running_server(tiny_model) as server:
            async with connected(server.port) as client:
                with gate.held(after=3):
                    await client.send_request("POST", "/v1/chat/completions", json.dumps(body).encode())
                    assert (await client.read_head()).status_code == 200
                    await gate.until_blocked()
                    server.end_generations()
                raw = await client.read_body()
    payloads = parse_sse(raw)  # strict framing, even for the error
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["type"] == "server_error" and "shutting down" in error["message"]
    chunks = [json.loads(p) for p in payloads[:-2]]
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1}
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
