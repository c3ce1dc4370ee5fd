"""The quick start's model with default settings: its publisher's sampling, a bounded chat, the repetition guard.

SmolLM2-135M-Instruct's GGUF carries no sampling defaults; its named-model entry
holds the model card's (temperature 0.2, top_p 0.9). Sampled at temperature 1 it
answers "What is the capital of France?" with gibberish, and greedy or at 0.2 a
poem falls into a loop that, without a cap, runs to the end of its 8,192-token
context. Every request here goes through the official openai client over a real
socket; seeds make the sampled answers repeatable.
"""

from __future__ import annotations

import openai
import pytest
import trio

from kestrel_trio import RepetitionGuard, SamplingDefaults, load_model
from kestrel_trio.model import Model
from kestrel_trio.server import DEFAULT_CHAT_MAX_TOKENS

from real_models import smollm2_135m
from server_kit import fetch, running_server

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
POEM = [{"role": "user", "content": "Write a poem about the number 7."}]


@pytest.fixture(scope="module")
def smollm2() -> Model:
    return load_model(smollm2_135m())


def client(server) -> openai.OpenAI:
    # A generous timeout: a 1,024-token answer takes minutes on a loaded 2-core machine.
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=900)


async def chat(server, messages: list[dict], **fields) -> tuple[str, str, int]:
    def run():
        answer = client(server).chat.completions.create(model="smollm2", messages=messages, **fields)
        return answer.choices[0].message.content, answer.choices[0].finish_reason, answer.usage.completion_tokens

    return await trio.to_thread.run_sync(run)


async def test_the_publishers_sampling_is_the_default_and_the_card_says_so(smollm2: Model) -> None:
    # 40 tokens hold the answer; a try that goes astray would otherwise ramble on to the cap.
    with trio.fail_after(900):
        async with running_server(smollm2, model_id="smollm2") as server:
            card = (await fetch(server.port, "GET", "/v1/models/smollm2")).json()
            answers = [await chat(server, CAPITAL, seed=seed, max_tokens=40) for seed in range(10)]
            explicit = [await chat(server, CAPITAL, seed=seed, max_tokens=40, temperature=0.2, top_p=0.9)
                        for seed in range(5)]
    assert card["sampling_defaults"] == {"temperature": 0.2, "top_p": 0.9, "top_k": 0, "min_p": 0.0,
                                         "repetition_penalty": 1.0, "max_tokens": DEFAULT_CHAT_MAX_TOKENS,
                                         "repetition_guard": None}
    assert answers[:5] == explicit  # no temperature sent: the model card's 0.2 and 0.9, draw for draw
    # The Q4_1 file is torn at the first token ("The" 0.55, "L" 0.36 at 0.2: "L'Étoile, la Marseillaise, ..."):
    # seeds 0-29 gave Paris 20 times at the card's settings, 14 at temperature 1.
    assert sum("Paris" in text for text, _, _ in answers) >= 6, answers


async def test_the_servers_flags_win_over_the_model_and_a_request_over_both(smollm2: Model) -> None:
    with trio.fail_after(600):
        async with running_server(smollm2, model_id="smollm2", sampling_defaults=SamplingDefaults(temperature=0)) \
                as server:
            card = (await fetch(server.port, "GET", "/v1/models")).json()["data"][0]
            greedy = await chat(server, CAPITAL, seed=1)
            again = await chat(server, CAPITAL, seed=2)
            hot = await chat(server, CAPITAL, seed=3, temperature=2.0, max_tokens=12)
    assert card["sampling_defaults"]["temperature"] == 0.0 and card["sampling_defaults"]["top_p"] == 0.9
    assert greedy == again and greedy[0] == "The capital of France is Paris."  # greedy: seeds change nothing
    assert hot[0] != greedy[0]  # the request's temperature 2 is not the server's 0


async def test_a_poem_without_max_tokens_ends_within_the_default_cap(smollm2: Model) -> None:
    # The acceptance: no max_tokens, no temperature. At 0.2 this poem loops; the cap ends it.
    with trio.fail_after(1800):  # a fixed, generous bound; before the cap this chat ran to 8,192 tokens
        async with running_server(smollm2, model_id="smollm2") as server:
            text, reason, tokens = await chat(server, POEM, seed=0)
    assert tokens <= DEFAULT_CHAT_MAX_TOKENS
    assert reason == "stop" or (reason == "length" and tokens == DEFAULT_CHAT_MAX_TOKENS), (reason, tokens)


async def test_the_repetition_guard_ends_a_looping_poem_early_with_length(smollm2: Model) -> None:
    guard = {"window": 128, "repeats": 4}
    with trio.fail_after(1200):
        async with running_server(smollm2, model_id="smollm2") as server:
            text, reason, tokens = await chat(server, POEM, temperature=0, max_tokens=DEFAULT_CHAT_MAX_TOKENS,
                                              extra_body={"repetition_guard": guard})
            # The guard as a server default: the same, for a request that says nothing; false turns it off.
        async with running_server(smollm2, model_id="smollm2", sampling_defaults=SamplingDefaults(
                temperature=0, repetition_guard=RepetitionGuard(128, 4))) as server:
            by_default = await chat(server, POEM, max_tokens=DEFAULT_CHAT_MAX_TOKENS)
            unguarded = await chat(server, POEM, max_tokens=300, extra_body={"repetition_guard": False})
    assert reason == "length" and tokens < DEFAULT_CHAT_MAX_TOKENS // 2, (reason, tokens)
    ids = smollm2.encode(text)
    tail = ids[-128:]
    assert any(all(tail[i] == tail[i - p] for i in range(p, 128)) for p in range(1, 33))  # it did loop
    assert by_default == (text, reason, tokens)
    assert unguarded[1:] == ("length", 300)  # no guard: on to max_tokens
