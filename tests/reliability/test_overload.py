"""Overload: ten times more concurrent requests than the engine queue (or the
connection limit) holds. Every request gets a complete answer or an immediate
429/503 with Retry-After; none hangs and none is dropped without a response.
"""

from __future__ import annotations

import json

import h11
import trio
from rel_kit import (
    RawResponse,
    StepGate,
    assert_envelope,
    assert_stream_complete,
    completion_json,
    connected,
    fetch,
    running_server,
    wait_until,
)

from kestrel_trio.engine import EngineLimits
from kestrel_trio.http import HttpLimits
from kestrel_trio.model import Model

QUEUE = EngineLimits(max_queued=4, max_batch=2)
FLOOD = 10 * QUEUE.max_queued
MAX_TOKENS = 3


async def send_one(port: int, index: int, results: dict[int, RawResponse | str]) -> None:
    """One client; records its response, or what went wrong instead."""
    body = completion_json(MAX_TOKENS, stream=index % 2 == 0, prompt=f"Request number {index}")
    try:
        results[index] = await fetch(port, "POST", "/v1/completions", body)
    except (OSError, EOFError, trio.BrokenResourceError, h11.ProtocolError) as exc:
        results[index] = f"no response: {exc!r}"


def assert_full_answer_or_refusal(index: int, response: RawResponse | str) -> str:
    """'served' or 'refused', after checking the response is one of the two complete kinds."""
    assert isinstance(response, RawResponse), f"request {index}: {response}"
    if response.status == 200:
        if index % 2 == 0:
            assert_stream_complete(response)
            payloads = response.sse_payloads()
            assert sum(bool(json.loads(p)["choices"][0]["text"]) for p in payloads[:-1]) <= MAX_TOKENS
        else:
            assert response.json()["usage"]["completion_tokens"] == MAX_TOKENS
        return "served"
    assert response.status in (429, 503), (response.status, response.body[:200])
    error = assert_envelope(response, response.status)
    assert error["code"] in ("queue_full", "too_many_connections")
    assert int(response.headers["retry-after"]) >= 1
    return "refused"


async def test_refusals_arrive_while_the_engine_is_held(tiny_model: Model, gate: StepGate) -> None:
    results: dict[int, RawResponse | str] = {}
    with trio.fail_after(30):
        async with running_server(tiny_model, engine_limits=QUEUE) as server:
            engine = server.engine
            async with trio.open_nursery() as nursery:
                with gate.held():
                    for index in range(FLOOD):
                        nursery.start_soon(send_one, server.port, index, results)
                    await gate.until_blocked()
                    # Every refusal comes back while the only model step is still held: none waits on the engine.
                    await wait_until(lambda: len(results) == FLOOD - engine.active - engine.queued)
                    refused_while_held = len(results)
                    assert engine.metrics.steps.value() == 0
                    assert engine.queued == QUEUE.max_queued
            await wait_until(lambda: engine.active == 0 and engine.queued == 0)

    kinds = [assert_full_answer_or_refusal(index, results[index]) for index in range(FLOOD)]
    assert kinds.count("refused") == refused_while_held
    assert QUEUE.max_queued + 1 <= kinds.count("served") <= QUEUE.max_queued + QUEUE.max_batch


async def test_a_free_running_flood_gets_answers_or_refusals(tiny_model: Model) -> None:
    results: dict[int, RawResponse | str] = {}
    with trio.fail_after(30):
        async with running_server(tiny_model, engine_limits=QUEUE) as server:
            async with trio.open_nursery() as nursery:
                for index in range(FLOOD):
                    nursery.start_soon(send_one, server.port, index, results)
            await wait_until(lambda: server.engine.active == 0 and server.engine.queued == 0)
            health = await fetch(server.port, "GET", "/health")

    kinds = [assert_full_answer_or_refusal(index, results[index]) for index in range(FLOOD)]
    assert kinds.count("served") >= QUEUE.max_queued
    assert health.status == 200


async def test_a_connection_flood_gets_answers_or_503(tiny_model: Model) -> None:
    limits = HttpLimits(max_connections=4, linger_timeout=0.5)
    results: dict[int, RawResponse | str] = {}
    with trio.fail_after(30):
        async with running_server(tiny_model, engine_limits=QUEUE, http_limits=limits) as server:
            async with trio.open_nursery() as nursery:
                for index in range(10 * limits.max_connections):
                    nursery.start_soon(send_one, server.port, index, results)
            await wait_until(lambda: server.http.connections == 0)
            async with connected(server.port) as client:
                after = await client.request("GET", "/health")

    kinds = [assert_full_answer_or_refusal(index, results[index]) for index in range(10 * limits.max_connections)]
    print(f"connection flood: {kinds.count('served')} served, {kinds.count('refused')} refused")
    assert kinds.count("served") >= 1
    assert after.status == 200
