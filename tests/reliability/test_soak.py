"""Soak: ~1000 mixed requests (streaming, non-streaming, health, metrics, errors)
on a few keep-alive connections; every answer is right, nothing accumulates.

RSS is of the whole test process (client and server), so the CI bound is generous
(10% over the RSS after warm-up); benchmarks/server/bench_abuse.py applies the issue's 5%
to 10,000 requests.
"""

from __future__ import annotations

import gc
import json
import random

import trio
from rel_kit import (
    RawClient,
    assert_envelope,
    assert_stream_complete,
    chat_json,
    completion_json,
    connected,
    rss_bytes,
    running_server,
    task_count,
    wait_until,
)

from kestrel_trio.model import Model

CONNECTIONS = 8
WARM_UP = 100  # requests
TOTAL = 1000  # requests, warm-up included
RSS_GROWTH_BOUND = 0.10  # fraction of the post-warm-up RSS


async def mixed_request(client: RawClient, rng: random.Random) -> str:
    """Send one request of a random kind on ``client`` and check its answer; returns the kind."""
    kind = rng.choice(["stream", "chat", "completion", "health", "metrics", "models", "bad_json", "bad_field",
                       "unknown", "tokenize"])
    if kind == "stream":
        response = await client.request("POST", "/v1/completions",
                                        json.dumps(completion_json(2, stream=True)).encode())
        assert_stream_complete(response)
    elif kind == "chat":
        response = await client.request("POST", "/v1/chat/completions",
                                        json.dumps(chat_json(2, stream=False)).encode())
        assert response.status == 200 and response.json()["usage"]["completion_tokens"] == 2
    elif kind == "completion":
        response = await client.request("POST", "/v1/completions",
                                        json.dumps(completion_json(3, stream=False)).encode())
        assert response.status == 200 and response.json()["usage"]["completion_tokens"] == 3
    elif kind in ("health", "metrics", "models"):
        path = {"health": "/health", "metrics": "/metrics", "models": "/v1/models"}[kind]
        response = await client.request("GET", path)
        assert response.status == 200
    elif kind == "bad_json":
        assert_envelope(await client.request("POST", "/v1/completions", b'{"prompt": "x",'), 400)
    elif kind == "bad_field":
        body = json.dumps({**completion_json(2, stream=False), "top_p": "wide"}).encode()
        assert assert_envelope(await client.request("POST", "/v1/completions", body), 400)["param"] == "top_p"
    elif kind == "unknown":
        assert_envelope(await client.request("GET", "/v1/nothing-here"), 404)
    else:
        response = await client.request("POST", "/tokenize", b'{"prompt": "hello there"}')
        assert response.status == 200 and response.json()["count"] >= 1
    return kind


async def run_requests(port: int, count: int, rng: random.Random, kinds: list[str]) -> None:
    """``count`` requests spread over CONNECTIONS keep-alive connections."""
    async def one_connection(share: int, seed: float) -> None:
        local = random.Random(seed)
        async with connected(port) as client:
            for _ in range(share):
                kinds.append(await mixed_request(client, local))

    async with trio.open_nursery() as nursery:
        for index in range(CONNECTIONS):
            share = count // CONNECTIONS + (index < count % CONNECTIONS)
            nursery.start_soon(one_connection, share, rng.random())


async def test_a_thousand_mixed_requests_leave_nothing_behind(tiny_model: Model) -> None:
    rng = random.Random(7)
    kinds: list[str] = []
    with trio.fail_after(50):
        async with running_server(tiny_model) as server:
            await run_requests(server.port, WARM_UP, rng, kinds)
            await wait_until(lambda: server.http.connections == 0)
            tasks_after_warm_up = task_count()
            gc.collect()
            rss_warm = rss_bytes()

            await run_requests(server.port, TOTAL - WARM_UP, rng, kinds)
            await wait_until(lambda: server.http.connections == 0)
            await wait_until(lambda: task_count() == tasks_after_warm_up)
            gc.collect()
            rss_end = rss_bytes()
            engine = server.engine
            assert engine.active == 0 and engine.queued == 0

    growth = (rss_end - rss_warm) / rss_warm
    print(f"soak: {len(kinds)} requests, RSS after warm-up {rss_warm / 2**20:.1f} MiB, at the end "
          f"{rss_end / 2**20:.1f} MiB ({growth:+.1%})")
    assert len(kinds) == TOTAL
    assert len(set(kinds)) == 10  # every kind was exercised
    assert growth < RSS_GROWTH_BOUND
