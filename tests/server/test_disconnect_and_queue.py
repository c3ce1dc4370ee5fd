"""Clients that leave, a full queue, and graceful shutdown, over HTTP.

Where a test must see the engine busy, the :class:`StepGate` holds the
worker thread inside a model step until the test releases it.
"""

from __future__ import annotations

import functools
import json

import h11
import trio

from kestrel_trio.engine import EngineLimits
from kestrel_trio.model import Model
from kestrel_trio.openai import parse_sse
from kestrel_trio.server import serve

from server_kit import (
    HOST, StepGate, assert_envelope, assert_left_in_decode_and_stopped,
    connected, event_count, fetch, running_server, wait_until,
)


def completion_json(max_tokens: int, *, stream: bool) -> dict:
    """A greedy completion request that generates exactly ``max_tokens`` tokens (EOS ignored)."""
    return {
        "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream,
    }


def completion_body(max_tokens: int, *, stream: bool) -> bytes:
    return json.dumps(completion_json(max_tokens, stream=stream)).encode()


async def test_a_stream_whose_client_leaves_stops_within_one_step(demo_model: Model) -> None:
    long_run = 2000  # thousands of demo-model steps: seconds of work if the engine ignored the disconnect
    with trio.fail_after(30):
        async with running_server(demo_model) as server:
            engine = server.engine
            async with connected(server.port) as client:
                await client.send_request("POST", "/v1/completions", completion_body(long_run, stream=True))
                assert (await client.read_head()).status_code == 200
                await client.read_body(enough=lambda body: event_count(body) >= 3)
            # The socket is closed: the client has left mid-stream.

            await assert_left_in_decode_and_stopped(engine)
            steps_before = engine.metrics.steps.value()
            assert 3 <= steps_before < long_run

            response = await fetch(server.port, "POST", "/v1/completions", completion_json(4, stream=False))
            assert response.status == 200
            assert response.json()["choices"][0]["finish_reason"] == "length"
            assert response.json()["usage"]["completion_tokens"] == 4
            assert engine.metrics.steps.value() == steps_before + 4


async def test_a_request_whose_client_leaves_while_queued_runs_no_step(tiny_model: Model, gate: StepGate) -> None:
    with trio.fail_after(20):
        async with running_server(tiny_model, engine_limits=EngineLimits(max_batch=1)) as server:
            engine = server.engine
            async with connected(server.port) as first, connected(server.port) as second:
                with gate.held():
                    await first.send_request("POST", "/v1/completions", completion_body(5, stream=True))
                    await gate.until_blocked()  # the first request's first step is in flight
                    await second.send_request("POST", "/v1/completions", completion_body(50, stream=False))
                    await wait_until(lambda: engine.queued == 1)
                    await second.aclose()
                    await wait_until(lambda: engine.metrics.cancelled.value(phase="queued") == 1)
                    assert engine.queued == 0
                response = await first.read_response()
            await wait_until(lambda: engine.active == 0)

            assert response.status == 200 and response.sse_payloads()[-1] == "[DONE]"
            assert engine.metrics.steps.value() == 5  # the first request's steps only
            assert engine.metrics.generation_tokens.value() == 5
            assert engine.max_steps_after_abandon == 0
            cancelled = engine.metrics.cancelled
            assert cancelled.value(phase="decode") == cancelled.value(phase="prefill") == 0


async def test_a_full_queue_answers_429_at_once_and_health_stays_up(tiny_model: Model, gate: StepGate) -> None:
    limits = EngineLimits(max_queued=1, max_batch=1)
    with trio.fail_after(20):
        async with running_server(tiny_model, engine_limits=limits) as server:
            engine = server.engine
            async with connected(server.port) as active, connected(server.port) as queued:
                with gate.held():
                    await active.send_request("POST", "/v1/completions", completion_body(3, stream=True))
                    await gate.until_blocked()
                    await queued.send_request("POST", "/v1/completions", completion_body(3, stream=False))
                    await wait_until(lambda: engine.queued == 1)

                    # Both answers arrive while the worker is still held: neither waits on the engine.
                    refused = await fetch(server.port, "POST", "/v1/completions", completion_json(3, stream=True))
                    health = await fetch(server.port, "GET", "/health")
                    assert engine.metrics.steps.value() == 0
                served = [await active.read_response(), await queued.read_response()]

    error = assert_envelope(refused, 429)
    assert (error["type"], error["code"]) == ("rate_limit_error", "queue_full")
    assert int(refused.headers["retry-after"]) >= 1
    assert health.status == 200
    assert {key: health.json()[key] for key in ("status", "busy", "queued", "active", "batch")} == {
        "status": "ok", "busy": True, "queued": 1, "active": 1, "batch": 1,
    }
    assert [response.status for response in served] == [200, 200]
    assert served[1].json()["usage"]["completion_tokens"] == 3


async def test_graceful_shutdown_ends_a_stream_with_an_error_event(tiny_model: Model, gate: StepGate) -> None:
    returned = trio.Event()

    async def run_server(*, task_status):
        try:
            await serve(tiny_model, host=HOST, port=0, grace=0.3, task_status=task_status)
        finally:
            returned.set()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(run_server)
            async with connected(server.port) as client:
                with gate.held(after=3):
                    await client.send_request("POST", "/v1/completions", completion_body(200, stream=True))
                    assert (await client.read_head()).status_code == 200
                    await gate.until_blocked()  # three tokens made, the fourth step held past the grace
                    server.shutdown()
                    body = await client.read_body()
                    assert not returned.is_set()  # serve still waits for the held step
        assert returned.is_set()

    payloads = parse_sse(body)
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["type"] == "server_error"
    assert error["message"]
    chunks = [json.loads(p) for p in payloads[:-2]]
    assert chunks and all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks)
    assert server.engine.status == "stopped"


async def test_shutdown_lets_a_request_finish_within_the_grace(tiny_model: Model) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(functools.partial(serve, tiny_model, host=HOST, port=0, grace=10.0))
            async with connected(server.port) as client:
                await client.send_request("POST", "/v1/completions", completion_body(20, stream=True))
                assert (await client.read_head()).status_code == 200
                server.shutdown()
                body = await client.read_body()
    payloads = parse_sse(body)
    assert payloads[-1] == "[DONE]"
    assert json.loads(payloads[-2])["choices"][0]["finish_reason"] == "length"


async def test_during_the_drain_delay_health_says_draining_and_requests_are_still_served(tiny_model: Model) -> None:
    drain_delay = 1.0  # s: long enough for the checks below on a busy machine, short for the suite
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                functools.partial(serve, tiny_model, host=HOST, port=0, grace=5.0, drain_delay=drain_delay))
            server.shutdown()
            await trio.sleep(0)  # let serve's drain begin
            health = await fetch(server.port, "GET", "/health")
            assert (health.status, health.json()["status"]) == (503, "draining")
            answer = await fetch(server.port, "POST", "/v1/completions", completion_json(3, stream=False))
            assert answer.status == 200 and answer.json()["usage"]["completion_tokens"] == 3
            with trio.fail_after(drain_delay + 5):
                while True:  # once the delay is over, the listener closes
                    try:
                        await fetch(server.port, "GET", "/health")
                    except (OSError, EOFError, h11.RemoteProtocolError):
                        # refused, or accepted just before the close and closed before the request's bytes
                        # arrived (a request already in the socket is served: tests/http/test_http_lifecycle.py)
                        break
                    await trio.sleep(0.05)
