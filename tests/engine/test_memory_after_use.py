"""Memory after use: an idle engine gives back what its generations held (tiny fixture, 512 KV bytes a token).

What held it, measured with SmolLM2-135M (docs/operations.md, "Memory after use"): caches allocated at
their whole reservation (numpy's huge pages made all of it resident), prefix-cache entries kept at that
size, and freed caches left in the worker thread's glibc arena. Each has a test here; none bounds RSS
absolutely: the heap test compares against the same process's own figures.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

import kestrel_trio
import kestrel_trio.engine.engine as engine_module
from kestrel_trio.engine import GenerationRequest
from kestrel_trio.model import Model
from kestrel_trio.text import SamplingParams

from engine_kit import running_engine, wait_until

BLOCK = 64
TOKEN_BYTES = 512  # tiny fixture: 2 layers x 2 kv heads x 16 x K and V x 4 bytes
SRC = Path(kestrel_trio.__file__).resolve().parents[1]  # the package under test, for the probe's process


def request(prompt: list[int], max_tokens: int | None) -> GenerationRequest:
    return GenerationRequest(tuple(prompt), SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))


def prompt_of(length: int, start: int = 10) -> list[int]:
    return [(start + i * 7) % 500 + 5 for i in range(length)]


async def test_a_request_that_reserved_much_and_used_little_leaves_its_tokens_not_its_reservation(
    tiny_model: Model,
) -> None:
    with trio.fail_after(60):
        async with running_engine(tiny_model) as engine:
            async with engine.open_generation(request(prompt_of(20), 400)) as deltas:  # reserves 448 tokens
                got = 0
                async for _ in deltas:
                    got += 1
                    if got == 5:  # its client leaves after 5 tokens (the web page's Stop, a client timeout)
                        live = engine._active[0].generation.cache
                        assert live.capacity < 448  # grown with its tokens, not allocated at the reservation
                        break
            await wait_until(lambda: engine.memory_tidied == 1)  # the engine went idle: its entry was shrunk
            finished = engine.open_generation(request(prompt_of(30, 200), 300))  # reserves 384, uses 330
            assert len([d async for d in finished]) == 300  # kept at its tokens as it ends
            held = engine.prefix_cache.nbytes
            report = engine.memory_report()["kv_cache"]
    assert len(engine.prefix_cache) == 2
    assert held == (BLOCK + 6 * BLOCK) * TOKEN_BYTES  # 20 prompt tokens in one block, 330 tokens in six
    assert report["prefix_cache_bytes"] == report["used_bytes"] == held


async def test_the_engine_hands_free_heap_back_once_per_idle_spell(tiny_model: Model, monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(engine_module, "release_free_memory", lambda: calls.append(1) or True)
    with trio.fail_after(60):
        async with running_engine(tiny_model) as engine:
            await trio.sleep(0.05)
            assert calls == []  # nothing ran yet: nothing to give back
            for round_ in range(2):
                async with trio.open_nursery() as nursery:  # two at once: one idle spell after both
                    for start in (10, 300):
                        nursery.start_soon(_drain, engine, prompt_of(20, start + round_), 30)
                await wait_until(lambda: len(calls) == round_ + 1)
            await trio.sleep(0.05)
    assert len(calls) == 2 and engine.memory_tidied == 2


async def _drain(engine, prompt: list[int], max_tokens: int) -> None:
    assert len([d async for d in engine.open_generation(request(prompt, max_tokens))]) == max_tokens


_HEAP_PROBE = textwrap.dedent('''
    import threading
    import numpy as np
    from kestrel_trio.engine.memory.host_memory import release_free_memory

    def anon():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon"))

    def work():
        big = np.ones(16 * 2**20 // 8)  # mapped; freeing it raises glibc's mmap threshold to 16 MiB
        del big
        arrays = [np.ones(2 * 2**20 // 8) for _ in range(100)]  # 200 MiB, touched, now from this thread's arena
        del arrays[:-1]  # freed, all but the last: as a finished generation's caches are

    before = anon()
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    held = anon()
    release_free_memory()
    print(before, held, anon())
''')


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_memory_a_worker_thread_held_goes_back_to_the_kernel() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", _HEAP_PROBE], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    before, held, after = map(int, result.stdout.split())
    assert held - before > 64 * 2**20, (before, held)  # glibc kept the freed arrays: the case to fix
    assert after - before < (held - before) // 4, (before, held, after)  # given back, the same process's baseline
