"""Prompts with images through the engine: chunked prefill, batching with text, no prefix reuse."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import trio

from kestrel_trio import BadRequestError
from kestrel_trio.engine import EngineLimits, GenerationRequest, run_engine
from kestrel_trio.model import Model, load_model
from kestrel_trio.text import SamplingParams
from kestrel_trio.text.media.images import ImageProcessorConfig, preprocess_image

pytest.importorskip("PIL.Image")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NEW_TOKENS = 16
LIMITS = {"max_bytes": 1 << 20, "max_pixels": 1 << 20}


def _images(golden, *names: str) -> tuple:
    config = ImageProcessorConfig.read(FIXTURES / "qwen3_vl")
    return tuple(preprocess_image(bytes(golden[f"image_bytes_{n}"]), config, **LIMITS) for n in names)


def _request(ids, images=()) -> GenerationRequest:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    return GenerationRequest(tuple(int(i) for i in ids), params, prompt_param="messages", images=images)


def _own_greedy(model: Model, ids, images) -> list[int]:
    """The model's own greedy run: Qwen3VL.prepare / prefill / step, no engine."""
    vl = model.vision
    prompt = vl.prepare(np.asarray(ids), np.concatenate([i.pixel_values for i in images]),
                        np.asarray([i.grid_thw for i in images]))
    cache = vl.new_cache()
    logits = vl.prefill(cache, prompt)
    out = []
    while len(out) < NEW_TOKENS:
        out.append(int(np.argmax(logits)))
        logits = vl.step(cache, out[-1:], prompt.rope_delta)
    return out


async def _run(model: Model, limits: EngineLimits, requests: list[GenerationRequest], *, together: bool):
    """Token ids and cached_tokens of each request; ``together`` submits them all at once, else one by one."""
    results: list = [None] * len(requests)
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(functools.partial(run_engine, model, limits=limits))

        async def one(i: int) -> None:
            async with engine.open_generation(requests[i]) as deltas:
                items = [d async for d in deltas]
            results[i] = ([d.token_id for d in items], items[-1].cached_tokens)

        if together:
            async with trio.open_nursery() as clients:
                for i in range(len(requests)):
                    clients.start_soon(one, i)
        else:
            for i in range(len(requests)):
                await one(i)
        steps = engine.metrics.steps.value()
        nursery.cancel_scope.cancel()
    return results, steps


@pytest.mark.parametrize("chunk", [5, 256])
async def test_image_prompts_in_chunks_batched_with_text_equal_the_goldens(vl_model: Model, golden, chunk) -> None:
    requests = [
        _request(golden["image_input_ids"], _images(golden, "up")),
        _request(golden["text_input_ids"]),
        _request(golden["two_images_input_ids"], _images(golden, "up", "tall")),
    ]
    with trio.fail_after(60):
        results, _ = await _run(vl_model, EngineLimits(prefill_chunk=chunk, max_batch=4), requests, together=True)
    assert [r[0] for r in results] == [golden[f"{k}_greedy_ids"].tolist() for k in ("image", "text", "two_images")]


async def test_a_different_image_with_the_same_pad_ids_is_never_served_from_the_prefix_cache(vl_model, golden):
    first, second = _images(golden, "up"), _images(golden, "exact")
    assert first[0].grid_thw == second[0].grid_thw  # so both prompts have the very same token ids
    ids = golden["image_input_ids"]
    expected = [_own_greedy(vl_model, ids, first), _own_greedy(vl_model, ids, second)]
    assert expected[0] != expected[1]
    limits = EngineLimits(prefill_chunk=16, prefix_cache_bytes=64 * 2**20)
    with trio.fail_after(60):
        one_by_one, _ = await _run(vl_model, limits, [_request(ids, first), _request(ids, second)], together=False)
        together, _ = await _run(vl_model, limits, [_request(ids, first), _request(ids, second)], together=True)
    for results in (one_by_one, together):
        assert [r[0] for r in results] == expected
        assert [r[1] for r in results] == [0, 0]


async def test_a_text_model_engine_refuses_images(golden) -> None:
    text_model = load_model(FIXTURES / "qwen3_bf16_tied")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            engine = await nursery.start(run_engine, text_model)
            with pytest.raises(BadRequestError, match="does not accept images"):
                engine.open_generation(_request([1, 2, 3], _images(golden, "up")))
            assert engine.metrics.steps.value() == 0
            nursery.cancel_scope.cancel()


async def test_the_vision_tower_runs_one_block_per_engine_step(vl_model: Model, golden) -> None:
    depth = len(vl_model.vision.vision.blocks)
    request = _request(golden["image_input_ids"], _images(golden, "up"))
    with trio.fail_after(60):
        results, steps = await _run(vl_model, EngineLimits(prefill_chunk=4096), [request], together=True)
    assert results[0][0] == golden["image_greedy_ids"].tolist()
    # One step per block, then one step that merges, prefills the whole prompt and samples token 1, then decodes.
    assert steps == depth + 1 + (NEW_TOKENS - 1)


async def test_an_image_request_abandoned_mid_tower_stops_between_blocks(vl_model: Model, golden, gate) -> None:
    request = _request(golden["image_input_ids"], _images(golden, "up"))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            engine = await nursery.start(functools.partial(run_engine, vl_model, limits=EngineLimits()))
            with gate.held(after=1):  # the first vision block runs; the second step waits in the worker
                async with engine.open_generation(request):
                    await gate.until_blocked()
            while engine.active or engine.busy:
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    assert engine.max_steps_after_abandon <= 1
    assert engine.metrics.steps.value() == 2 < len(vl_model.vision.vision.blocks)
    assert engine.metrics.generation_tokens.value() == 0
