"""Speculative decoding behind the HTTP API: the same SSE stream as plain decoding, /health and /metrics say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from kestrel_trio import EngineLimits, KestrelError, ModelLoadError, load_model
from kestrel_trio.server import serve
from server_kit import HOST, fetch, running_server

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CHECKPOINT = FIXTURES / "qwen3_bf16_tied"
COPY = "Repeat after me: the quick brown fox jumps over the lazy dog. " * 3


@pytest.fixture(scope="module")
def model():
    return load_model(CHECKPOINT)


# A verify step's rows come from one forward pass over several tokens, whose float32 sums may round
# differently in the last bits from a one-token step's; logprobs (about -20 to 0) agree to this, tokens exactly.
LOGPROB_TOLERANCE = 1e-4


def _same(plain, fast, where: str = "event") -> None:
    """Assert two decoded SSE values are equal: floats within LOGPROB_TOLERANCE, everything else exactly.

    Rounding both to 4 decimals would not do: two values a last bit apart straddle a rounding boundary
    about once in a few hundred values.
    """
    if isinstance(plain, float) or isinstance(fast, float):  # a logprob may print as 0 (an int) on one side
        assert abs(plain - fast) <= LOGPROB_TOLERANCE, f"{where}: {plain} vs {fast}"
    elif isinstance(plain, dict) and isinstance(fast, dict):
        assert plain.keys() == fast.keys(), f"{where}: keys {sorted(plain)} vs {sorted(fast)}"
        for key in plain:
            _same(plain[key], fast[key], f"{where}.{key}")
    elif isinstance(plain, list) and isinstance(fast, list):
        assert len(plain) == len(fast), f"{where}: {len(plain)} vs {len(fast)} items"
        for index, (a, b) in enumerate(zip(plain, fast)):
            _same(a, b, f"{where}[{index}]")
    else:
        assert plain == fast, f"{where}: {plain!r} vs {fast!r}"


def _without_ids(payloads: list[str]) -> list:
    """Each SSE event's JSON without what differs between two runs (ids, timestamps)."""
    events = []
    for payload in payloads:
        if payload == "[DONE]":
            events.append(payload)
            continue
        event = json.loads(payload)
        for key in ("id", "created", "system_fingerprint"):
            event.pop(key, None)
        events.append(event)
    return events


async def _chat_stream(server) -> list:
    body = {"model": server.state.model_id, "messages": [{"role": "user", "content": COPY}], "temperature": 0,
            "max_tokens": 48, "stream": True, "stream_options": {"include_usage": True}, "logprobs": True,
            "top_logprobs": 2}
    response = await fetch(server.port, "POST", "/v1/chat/completions", body)
    assert response.status == 200, response.body
    return _without_ids(response.sse_payloads())


async def test_the_sse_stream_with_speculation_equals_the_plain_one(model):
    with trio.fail_after(60):
        async with running_server(model) as server:
            plain = await _chat_stream(server)
        limits = EngineLimits(speculative="ngram")
        async with running_server(model, engine_limits=limits) as server:
            fast = await _chat_stream(server)
            health = (await fetch(server.port, "GET", "/health")).json()
            metrics = (await fetch(server.port, "GET", "/metrics")).body.decode()
    assert len(plain) > 10
    _same(plain, fast)
    assert health["speculative"] == {"mode": "ngram", "tokens": 5, "draft_model": None}  # the documented default k
    drafted = next(line for line in metrics.splitlines()
                   if line.startswith("kestrel:spec_decode_num_draft_tokens_total "))
    assert float(drafted.split()[1]) > 0


async def test_serve_loads_a_draft_model_given_as_a_path(model):
    with trio.fail_after(60):
        async with running_server(model, draft_model=CHECKPOINT) as server:
            assert server.engine.speculation.mode == "draft"
            health = (await fetch(server.port, "GET", "/health")).json()
            stream = await _chat_stream(server)
            assert server.engine.metrics.spec_drafts.value() > 0
        async with running_server(model) as server:
            plain = await _chat_stream(server)
    _same(plain, stream)
    assert health["speculative"]["draft_model"] == "qwen3_bf16_tied"


async def test_a_draft_model_without_the_models_vocabulary_is_refused_before_anything_listens(model):
    with trio.fail_after(30):
        with pytest.raises(ModelLoadError, match="qwen3_fp32 has no tokenizer"):
            await serve(CHECKPOINT, host=HOST, port=0, draft_model=FIXTURES / "qwen3_fp32")
        with pytest.raises(ModelLoadError, match="its tokenizer has 509 tokens, the served model's 151669"):
            await serve(None, host=HOST, port=0, draft_model=CHECKPOINT)  # the demo model: Qwen3's vocabulary
        with pytest.raises(KestrelError, match="'ngram': choose one"):
            await serve(CHECKPOINT, host=HOST, port=0, draft_model=CHECKPOINT,
                        engine_limits=EngineLimits(speculative="ngram"))
