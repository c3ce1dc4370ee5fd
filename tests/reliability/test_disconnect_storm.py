"""Disconnect storm: 100 streaming clients leave at random points (queued, prefill,
decode, or after the last byte), some with FIN and some with a reset. Afterwards the
engine is idle, no job, KV cache, connection or task is left behind, and a fresh
request gets exactly the answer it got before the storm.
"""

from __future__ import annotations

import gc
import json
import random

import trio
from rel_kit import (
    RawClient,
    abort,
    completion_json,
    event_count,
    fetch,
    running_server,
    task_count,
    wait_until,
)

from kestrel_trio._model.cache.kv_cache import KVCache
from kestrel_trio.engine import Engine, EngineLimits
from kestrel_trio.engine.engine import Job
from kestrel_trio.model import Model
from kestrel_trio.server import Server

CLIENTS = 100
SEED = 20261130
# 200-token prompts in 4-token prefill chunks: 50 prefill steps, so clients can leave mid-prefill. Each
# client's prompt starts with its own token, so the prefix cache cannot skip anyone's prefill.
LIMITS = EngineLimits(max_queued=CLIENTS, max_batch=4, prefill_chunk=4)
PROMPT_TAIL = [(7 * i) % 400 + 10 for i in range(199)]


def storm_request(index: int, max_tokens: int) -> bytes:
    body = {"prompt": [index + 1, *PROMPT_TAIL], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    return json.dumps(body).encode()


def job_with_max_tokens(engine: Engine, max_tokens: int) -> Job | None:
    return next((job for job in engine._active if job.generation.params.max_tokens == max_tokens), None)


def live_caches(engine: Engine) -> set[int]:
    """Ids of the KV caches alive now, except those the engine's (bounded) prefix cache keeps on purpose."""
    gc.collect()
    kept = {id(entry.cache) for entry in engine.prefix_cache._entries.values()}
    return {id(obj) for obj in gc.get_objects() if isinstance(obj, KVCache)} - kept


async def storm_client(server: Server, index: int, rng: random.Random, outcomes: list[str]) -> None:
    """Send a streaming request, then leave at a point chosen by ``rng`` (or read to the end).

    A client that leaves in "prefill" finds its own job by its unique max_tokens and waits until it is admitted.
    """
    leave_after = rng.choice(["sent", "head", "prefill", 1, 2, 5, 12, "end"])
    max_tokens = 100 + index if leave_after == "prefill" else rng.randint(10, 40)
    use_reset = rng.random() < 0.5
    client = await RawClient.connect(server.port)
    try:
        await client.send_request("POST", "/v1/completions", storm_request(index, max_tokens))
        if leave_after != "sent":
            head = await client.read_head()
            assert head.status_code == 200
        if leave_after == "prefill":
            await wait_until(lambda: job_with_max_tokens(server.engine, max_tokens) is not None, interval=0.002)
        elif isinstance(leave_after, int):
            await client.read_body(enough=lambda body: event_count(body) >= leave_after)
        elif leave_after == "end":
            body = await client.read_body()
            assert body.endswith(b"data: [DONE]\n\n")
    finally:
        if use_reset:
            await abort(client.stream)
        else:
            await client.aclose()
    outcomes.append(str(leave_after))


async def test_a_disconnect_storm_leaves_nothing_behind(tiny_model: Model) -> None:
    rng = random.Random(SEED)
    fresh = completion_json(6, stream=False, prompt="The storm")
    with trio.fail_after(45):
        async with running_server(tiny_model, engine_limits=LIMITS) as server:
            engine = server.engine
            before = await fetch(server.port, "POST", "/v1/completions", fresh)
            await wait_until(lambda: server.http.connections == 0)
            tasks_before = task_count()
            caches_before = live_caches(engine)  # earlier tests of the session may still hold some

            outcomes: list[str] = []
            async with trio.open_nursery() as nursery:
                for index in range(CLIENTS):
                    nursery.start_soon(storm_client, server, index, random.Random(rng.random()), outcomes)

            await wait_until(lambda: engine.active == 0 and engine.queued == 0 and server.http.connections == 0)
            await wait_until(lambda: task_count() == tasks_before)
            metrics = engine.metrics
            cancelled = {phase: metrics.cancelled.value(phase=phase) for phase in ("queued", "prefill", "decode")}
            finished = metrics.finished.value(finished_reason="length") - 1  # the request before the storm
            accepted = metrics.accepted.value() - 1
            leftover_jobs = len(engine._waiting) + len(engine._active)
            leftover_queue = engine._queue_recv.statistics().current_buffer_used
            leaked_caches = live_caches(engine) - caches_before
            prefix_bytes = engine.prefix_cache.nbytes
            after = await fetch(server.port, "POST", "/v1/completions", fresh)
            health = await fetch(server.port, "GET", "/health")

    print(f"disconnect storm: cancelled {cancelled}, finished {finished}, outcomes "
          f"{ {key: outcomes.count(key) for key in sorted(set(outcomes))} }")
    assert len(outcomes) == CLIENTS
    assert sum(cancelled.values()) + finished == CLIENTS == accepted  # each generation ended exactly once
    assert cancelled["queued"] >= 1 and cancelled["prefill"] >= 1 and cancelled["decode"] >= 1
    assert engine.max_steps_after_abandon <= 1
    assert leftover_jobs == 0 and leftover_queue == 0
    assert not leaked_caches
    assert prefix_bytes <= LIMITS.prefix_cache_bytes
    assert before.status == after.status == 200
    assert after.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]
    assert health.json()["status"] == "ok" and health.json()["active"] == 0 and health.json()["queued"] == 0
