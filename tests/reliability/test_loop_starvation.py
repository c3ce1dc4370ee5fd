"""Big but legal request bodies must not starve the event loop: /health keeps
answering while a multi-megabyte prompt is tokenized or a huge conversation is
rendered through the chat template (each ends in a 400 context-length error).

Real sockets and the real clock: the stall being measured is real CPU time.
"""

from __future__ import annotations

import json

import trio
from rel_kit import LatencyProbe, assert_envelope, connected, running_server

from kestrel_trio.model import Model

HEALTH_BOUND = 0.25  # s, five times the 50 ms budget: only a real stall can exceed it
HUGE_PROMPT = json.dumps({"prompt": "a" * 3_000_000, "max_tokens": 1}).encode()  # 3 MB < the 4 MiB body limit
HUGE_CHAT = json.dumps({"messages": [{"role": "user", "content": "x"}] * 60_000, "max_tokens": 1}).encode()


async def post_raw(port: int, path: str, body: bytes, answers: list) -> None:
    async with connected(port) as client:
        answers.append(await client.request("POST", path, body))


async def test_health_stays_fast_while_huge_prompts_are_processed(tiny_model: Model) -> None:
    answers: list = []
    with trio.fail_after(60):
        async with running_server(tiny_model) as server:
            probe = LatencyProbe(server.port)
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe.run, 0.01, stop)
                async with trio.open_nursery() as heavy:
                    heavy.start_soon(post_raw, server.port, "/v1/completions", HUGE_PROMPT, answers)
                    heavy.start_soon(post_raw, server.port, "/v1/chat/completions", HUGE_CHAT, answers)
                stop.set()
            steps = server.engine.metrics.steps.value()

    print(f"loop starvation: /health max {max(probe.samples) * 1000:.0f} ms over {len(probe.samples)} probes")
    for response in answers:
        assert assert_envelope(response, 400)["code"] == "context_length_exceeded"
    assert steps == 0
    assert not probe.failures
    assert max(probe.samples) < HEALTH_BOUND, sorted(probe.samples)[-3:]
