"""``POST /v1/embeddings`` with the official openai client, and the engine's embedding job.

The vectors through the whole server (token-id inputs, a prefill chunk small enough that an input spans
several steps) are checked against transformers' goldens (tests/fixtures/make_embedding_goldens.py); the
engine tests check that a batch is one queued job: 429 when the queue is full, abandoned without compute.
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path

import numpy as np
import openai
import pytest
import trio

from kestrel_trio.engine import EmbeddingRequest, EngineLimits, run_engine
from kestrel_trio.errors import ContextLengthError, EngineUnavailableError, QueueFullError
from kestrel_trio.model import Model, load_model

from server_kit import assert_envelope, client_for, connected, fetch, running_server, wait_until
from slow_host import allowance

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_embedding"


@pytest.fixture(scope="module")
def embedding_model() -> Model:
    return load_model(FIXTURE, weights="fp32")


async def test_an_embedding_checkpoint_is_listed_as_one(embedding_model: Model) -> None:
    with trio.fail_after(allowance(60)):
        async with running_server(embedding_model) as server:
            shown = await fetch(server.port, "POST", "/api/show", {"model": server.state.model_id})
    assert shown.status == 200 and "embedding" in shown.json()["capabilities"]
    assert embedding_model.embedding_checkpoint and embedding_model.pooling == "last"


async def test_vectors_through_the_server_match_transformers(embedding_model: Model) -> None:
    golden = np.load(FIXTURE / "embedding_golden.npz")
    inputs = [golden[f"ids_{i}"].tolist() for i in range(3)]
    with trio.fail_after(allowance(120)):
        async with running_server(embedding_model, engine_limits=EngineLimits(prefill_chunk=16)) as server:
            def work():
                with client_for(server) as client:
                    return client.embeddings.create(model=server.state.model_id, input=inputs,
                                                    encoding_format="float")
            result = await trio.to_thread.run_sync(work)
    got = np.asarray([item.embedding for item in result.data])  # [3, 64]
    assert [item.index for item in result.data] == [0, 1, 2]
    error = np.linalg.norm(got - golden["last"], axis=1) / np.linalg.norm(golden["last"], axis=1)  # [3]
    assert error.max() < 1e-4, error
    assert result.usage.prompt_tokens == result.usage.total_tokens == sum(len(ids) for ids in inputs)


async def test_texts_base64_dimensions_and_refusals(demo_model: Model) -> None:
    texts = ["The cat sat on the mat.", "Ein Hund bellt."]
    with trio.fail_after(allowance(120)):
        async with running_server(demo_model) as server:
            model_id = server.state.model_id

            def work():
                with client_for(server) as client:
                    floats = client.embeddings.create(model=model_id, input=texts, encoding_format="float")
                    encoded = client.embeddings.create(model=model_id, input=texts)  # the SDK asks for base64
                    single = client.embeddings.create(model=model_id, input=texts[1], user="u-1")
                    cut = client.embeddings.create(model=model_id, input=texts, dimensions=16,
                                                   encoding_format="float")
                    with pytest.raises(openai.BadRequestError) as too_wide:
                        client.embeddings.create(model=model_id, input="x", dimensions=65)
                    with pytest.raises(openai.BadRequestError) as unknown:
                        client.embeddings.create(model=model_id, input="x", extra_body={"pooling": "max"})
                    with pytest.raises(openai.NotFoundError):
                        client.embeddings.create(model="another-model", input="x")
                    return floats, encoded, single, cut, too_wide.value, unknown.value

            floats, encoded, single, cut, too_wide, unknown = await trio.to_thread.run_sync(work)
            raw = await fetch(server.port, "POST", "/v1/embeddings",
                              {"model": model_id, "input": [], "encoding_format": "float"})
            wrong_format = await fetch(server.port, "POST", "/v1/embeddings",
                                       {"model": model_id, "input": "x", "encoding_format": "int8"})
            outside = await fetch(server.port, "POST", "/v1/embeddings",
                                  {"model": model_id, "input": [[1, 2], [3, 10**9]]})
            ids = demo_model.encode(texts[1])
            by_ids = await fetch(server.port, "POST", "/v1/embeddings", {"model": model_id, "input": ids})
    vectors = np.asarray([item.embedding for item in floats.data])  # [2, 64]
    assert vectors.shape == (2, 64)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert np.allclose(np.asarray([item.embedding for item in encoded.data]), vectors, atol=1e-7)
    assert np.allclose(single.data[0].embedding, vectors[1], atol=1e-6)  # alone or batched: the same vector
    want = vectors[:, :16] / np.linalg.norm(vectors[:, :16], axis=1, keepdims=True)  # [2, 16]
    assert np.allclose(np.asarray([item.embedding for item in cut.data]), want, atol=1e-6)
    assert floats.usage.prompt_tokens == sum(len(demo_model.encode(text)) for text in texts)
    assert too_wide.body["param"] == "dimensions" and "64" in too_wide.body["message"]
    assert unknown.body["param"] == "pooling"
    assert assert_envelope(raw, 400)["param"] == "input"
    assert assert_envelope(wrong_format, 400)["param"] == "encoding_format"
    assert assert_envelope(outside, 400)["param"] == "input[1]"
    assert by_ids.status == 200 and by_ids.json()["usage"]["prompt_tokens"] == len(ids)
    assert np.allclose(by_ids.json()["data"][0]["embedding"], vectors[1], atol=1e-6)  # the text's own tokens


def test_base64_is_little_endian_float32() -> None:
    from kestrel_trio.openai.embeddings import encode_vector
    data = base64.b64decode(encode_vector([1.0, -0.5], "base64"))
    assert np.frombuffer(data, dtype="<f4").tolist() == [1.0, -0.5]


async def test_a_batch_is_one_queued_job_refused_when_the_queue_is_full(demo_model: Model) -> None:
    with trio.fail_after(allowance(120)):
        async with trio.open_nursery() as nursery:
            engine = await nursery.start(functools.partial(run_engine, demo_model, limits=EngineLimits(max_queued=1)))
            ids = tuple(demo_model.encode("hello there"))
            first = engine.open_embeddings(EmbeddingRequest((ids, ids, ids)))  # three inputs: one job
            assert engine.queued == 1
            with pytest.raises(QueueFullError):
                engine.open_embeddings(EmbeddingRequest((ids,)))
            first.cancel()  # abandoned while queued: it leaves the queue and never runs
            assert engine.queued == 0
            second = engine.open_embeddings(EmbeddingRequest((ids, ids)))
            async with second:
                result = await second.result()
            assert len(result.vectors) == 2 and result.prompt_tokens == 2 * len(ids)
            assert np.array_equal(result.vectors[0], result.vectors[1])
            assert engine.metrics.cancelled.value(phase="queued") == 1
            with pytest.raises(ContextLengthError):
                engine.open_embeddings(EmbeddingRequest((tuple([1] * (demo_model.context_length + 1)),)))
            nursery.cancel_scope.cancel()


async def test_a_running_job_abandoned_stops_between_two_chunks(demo_model: Model) -> None:
    limits = EngineLimits(prefill_chunk=1)  # one token per step: a 64-token input takes 64 steps
    with trio.fail_after(allowance(120)):
        async with trio.open_nursery() as nursery:
            engine = await nursery.start(functools.partial(run_engine, demo_model, limits=limits))
            handle = engine.open_embeddings(EmbeddingRequest((tuple(range(100, 164)),)))
            job = handle._job
            await wait_until(lambda: job.run.tokens_fed > 0)
            handle.cancel()
            fed = job.run.tokens_fed
            await wait_until(lambda: engine._embedding is None)
            assert not job.run.done and len(job.run.vectors) == 0
            assert job.run.tokens_fed <= fed + 1 < 64  # at most the chunk in flight ran after the cancel
            assert engine.metrics.cancelled.value(phase="prefill") == 1
            assert engine.kv_usage.reserved_bytes == 0  # its KV reservation is released
            nursery.cancel_scope.cancel()


async def test_a_full_queue_refuses_embeddings_with_429_in_each_apis_shape(tiny_model: Model, gate) -> None:
    limits = EngineLimits(max_queued=1, max_batch=1)
    completion = {"prompt": "Hello", "max_tokens": 3, "stream": True}
    with trio.fail_after(allowance(60)):
        async with running_server(tiny_model, engine_limits=limits) as server:
            engine = server.engine
            model_id = server.state.model_id
            async with connected(server.port) as active, connected(server.port) as queued:
                with gate.held():
                    await active.send_request("POST", "/v1/completions", json.dumps(completion).encode())
                    await gate.until_blocked()
                    await queued.send_request("POST", "/v1/embeddings",
                                              json.dumps({"model": model_id, "input": ["a", "b"]}).encode())
                    await wait_until(lambda: engine.queued == 1)  # the two inputs wait as one job
                    openai_refusal = await fetch(server.port, "POST", "/v1/embeddings",
                                                 {"model": model_id, "input": "c"})
                    ollama_refusal = await fetch(server.port, "POST", "/api/embed", {"model": model_id, "input": "c"})
                served = [await active.read_response(), await queued.read_response()]
    error = assert_envelope(openai_refusal, 429)
    assert error["code"] == "queue_full" and int(openai_refusal.headers["retry-after"]) >= 1
    assert ollama_refusal.status == 429 and "queue is full" in ollama_refusal.json()["error"]
    assert int(ollama_refusal.headers["retry-after"]) >= 1
    assert [response.status for response in served] == [200, 200]
    assert len(served[1].json()["data"]) == 2


async def test_a_shutdown_ends_queued_embeddings_with_the_error_and_frees_their_places(demo_model: Model) -> None:
    with trio.fail_after(allowance(120)):
        async with trio.open_nursery() as nursery:
            engine = await nursery.start(functools.partial(run_engine, demo_model, limits=EngineLimits(max_queued=2)))
            request = EmbeddingRequest((tuple(demo_model.encode("hello")),))
            handles = [engine.open_embeddings(request), engine.open_embeddings(request)]  # the second one waits
            engine.end_generations(EngineUnavailableError("the server is shutting down"))
            for handle in handles:
                with pytest.raises(EngineUnavailableError, match="shutting down"):
                    await handle.result()
                handle.cancel()
            assert engine.queued == 0  # their places in the queue are free again
            nursery.cancel_scope.cancel()
