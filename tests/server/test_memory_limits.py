"""The context cap and the KV budget as clients see them: /v1/models, /tokenize, /health, /metrics and the 400s."""

from __future__ import annotations

import openai
import pytest
import trio

from kestrel_trio.engine import EngineLimits
from kestrel_trio.model import Model

from server_kit import assert_envelope, client_for, fetch, running_server

BLOCK_BYTES = 64 * 512  # a 64-token block of the tiny fixture's fp32 KV


async def test_max_model_len_is_reported_and_enforced_everywhere(tiny_model: Model) -> None:
    limits = EngineLimits(max_model_len=128)
    with trio.fail_after(30):
        async with running_server(tiny_model, engine_limits=limits) as server:
            models = (await fetch(server.port, "GET", "/v1/models")).json()
            tokenized = (await fetch(server.port, "POST", "/tokenize", {"prompt": "hello there"})).json()
            health = (await fetch(server.port, "GET", "/health")).json()
            ids = list(range(10, 110))
            over = await fetch(server.port, "POST", "/v1/completions", {"prompt": ids, "max_tokens": 40})
            too_long_ids = await fetch(server.port, "POST", "/v1/completions", {"prompt": list(range(10, 140))})
            words = await fetch(server.port, "POST", "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "river " * 300}]})
            # ignore_eos: the random model samples (temperature 1) and drew its EOS early now and then
            fits = await fetch(server.port, "POST", "/v1/completions",
                               {"prompt": ids, "max_tokens": 28, "ignore_eos": True})
            steps = server.engine.metrics.steps.value()
    assert models["data"][0]["max_model_len"] == 128
    assert tokenized["max_model_len"] == 128
    assert health["max_model_len"] == 128
    error = assert_envelope(over, 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert "context cap (max_model_len) of 128 tokens" in error["message"] and "(100 tokens)" in error["message"]
    for refused in (too_long_ids, words):
        error = assert_envelope(refused, 400)
        assert error["code"] == "context_length_exceeded" and "128" in error["message"]
    assert fits.status == 200 and fits.json()["usage"]["completion_tokens"] == 28
    assert steps == 28  # the refusals ran no model step


async def test_a_request_that_can_never_fit_the_kv_budget_gets_a_400_naming_it(tiny_model: Model) -> None:
    limits = EngineLimits(kv_cache_bytes=2 * BLOCK_BYTES)
    with trio.fail_after(30):
        async with running_server(tiny_model, engine_limits=limits) as server:
            response = await fetch(server.port, "POST", "/v1/completions",
                                   {"prompt": list(range(10, 30)), "max_tokens": 200})

            def official_client():
                with client_for(server) as client, pytest.raises(openai.BadRequestError) as refused:
                    client.chat.completions.create(model=tiny_model.name, max_tokens=300,
                                                   messages=[{"role": "user", "content": "Hi"}])
                return refused.value

            via_client = await trio.to_thread.run_sync(official_client)
            steps = server.engine.metrics.steps.value()
    error = assert_envelope(response, 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert "KV cache budget holds 128 tokens" in error["message"] and "needs 220 tokens" in error["message"]
    assert via_client.code == "context_length_exceeded" and "KV cache budget" in via_client.message
    assert steps == 0


async def test_health_and_metrics_show_the_kv_budget(tiny_model: Model) -> None:
    limits = EngineLimits(kv_cache_bytes=3 * BLOCK_BYTES, kv_dtype="bf16")
    with trio.fail_after(30):
        async with running_server(tiny_model, engine_limits=limits) as server:
            done = await fetch(server.port, "POST", "/v1/completions",
                               {"prompt": list(range(10, 30)), "max_tokens": 8, "ignore_eos": True})
            health = (await fetch(server.port, "GET", "/health")).json()
            metrics = (await fetch(server.port, "GET", "/metrics")).body.decode()
    assert done.status == 200
    kv = health["kv_cache"]
    assert kv["dtype"] == "bf16" and kv["budget_bytes"] == 3 * BLOCK_BYTES and kv["token_bytes"] == 256
    assert kv["budget_tokens"] == 6 * 64  # bf16: twice the tokens of fp32 in the same bytes
    assert kv["reserved_bytes"] == 0 and kv["waiting_for_kv"] == 0
    assert kv["used_bytes"] == kv["prefix_cache_bytes"] == 64 * 256  # the finished request's KV, kept for reuse
    assert "set" in kv["budget_from"]
    for line in (f"kestrel:kv_cache_budget_bytes {3 * BLOCK_BYTES}", "kestrel:kv_cache_reserved_bytes 0",
                 f"kestrel:kv_cache_used_bytes {64 * 256}", "kestrel:num_requests_waiting_for_kv 0",
                 "kestrel:kv_cache_waits_total 0", "kestrel:request_out_of_memory_total 0"):
        assert line in metrics, line


async def test_health_says_what_the_process_and_the_prefix_cache_hold(tiny_model: Model) -> None:
    limits = EngineLimits(prefix_cache_bytes=3 * BLOCK_BYTES, kv_cache_bytes=8 * BLOCK_BYTES)
    with trio.fail_after(30):
        async with running_server(tiny_model, engine_limits=limits) as server:
            done = await fetch(server.port, "POST", "/v1/completions",
                               {"prompt": list(range(10, 30)), "max_tokens": 8, "ignore_eos": True})
            response = await fetch(server.port, "GET", "/health")
    assert done.status == 200 and response.status == 200
    health = response.json()
    memory = health["memory"]
    assert memory["rss_bytes"] > 0 and memory["peak_rss_bytes"] >= memory["rss_bytes"]  # VmRSS, VmHWM
    kv = health["kv_cache"]
    assert kv["prefix_cache_budget_bytes"] == 3 * BLOCK_BYTES and kv["budget_bytes"] == 8 * BLOCK_BYTES
    assert kv["prefix_cache_bytes"] == BLOCK_BYTES  # the finished request's 28 tokens, kept in one block
