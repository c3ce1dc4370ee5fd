"""The reasoning budget through the official clients: Anthropic's ``thinking.budget_tokens`` and vLLM's
``thinking_token_budget`` on Chat Completions cut the reasoning.

The demo model (the real Qwen3 tokenizer, random weights) is made a stubborn reasoner: the real forward pass
runs, then its logits are tilted towards ``<think>`` and a filler word for as long as the reasoning block is
open, and towards the answer once ``</think>`` is written. Left alone it would reason to ``max_tokens``; the
budget is the only thing that can close its block. Everything past the logits (the sampler, the forced
token, detokenization, the engine, the routes, HTTP, the event stream) is the real code.

The rule for models the budget cannot hold on is tested beside it, on stand-in models.
"""

from __future__ import annotations

import json

import anthropic
import attrs
import numpy as np
import openai
import pytest
import trio

from kestrel_trio.app.chat.thinking import reasoning_budget
from kestrel_trio.errors import BadRequestError
from kestrel_trio.model import Model
from kestrel_trio.openai import parse_chat_request
from kestrel_trio.text.constraints.reasoning_budget import ReasoningBudget
from kestrel_trio.text.generation import Generation

from server_kit import HOST, client_for, in_worker, running_server
from slow_host import allowance

ANSWER = "The sky is blue because air scatters blue light most."
BUDGET = 1024  # Anthropic's smallest budget_tokens
QUESTION = [{"role": "user", "content": "Why is the sky blue?"}]


class StubbornReasoner:
    """Wraps ``Generation.advance``: opens a reasoning block, fills it until it is closed, then answers."""

    def __init__(self, model: Model) -> None:
        tokenizer = model.require_tokenizer()
        self.open, self.end = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
        self.filler = model.encode(" hmm")[0]
        self.answer = model.encode("\n\n" + ANSWER) + [min(tokenizer.eos_token_ids)]

    def wanted(self, generated: list[int]) -> int:
        if not generated:
            return self.open
        if self.end in generated:
            written = len(generated) - generated.index(self.end) - 1
            return self.answer[min(written, len(self.answer) - 1)]
        return self.filler

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_advance = Generation.advance
        reasoner = self

        def advance(generation: Generation, logits: np.ndarray | None):
            if logits is not None and generation.samples_next:  # None: a prompt chunk before the last
                logits = logits.copy()  # [vocab]
                logits[reasoner.wanted(generation.generated_ids)] = logits.max() + 40.0
            return real_advance(generation, logits)

        monkeypatch.setattr(Generation, "advance", advance)


@pytest.fixture
def stubborn(demo_model: Model, monkeypatch: pytest.MonkeyPatch) -> Model:
    StubbornReasoner(demo_model).install(monkeypatch)
    return demo_model


async def test_budget_tokens_cuts_the_thinking_block_and_the_answer_follows(stubborn) -> None:
    request = dict(messages=QUESTION, max_tokens=BUDGET + 200, thinking={"type": "enabled", "budget_tokens": BUDGET},
                   extra_body={"temperature": 0.0})
    with trio.fail_after(allowance(600)):
        async with running_server(stubborn) as server:
            def work(client: anthropic.Anthropic, model_id: str):
                full = client.messages.create(model=model_id, **request)
                with client.messages.stream(model=model_id, **request) as stream:
                    kinds = [event.delta.type for event in stream if event.type == "content_block_delta"]
                    streamed = stream.get_final_message()
                return full, kinds, streamed

            full, kinds, streamed = await in_worker(
                lambda: anthropic.Anthropic(base_url=f"http://{HOST}:{server.port}", api_key="unused",
                                            max_retries=0, timeout=allowance(600)),
                work, server.state.model_id)
    for message in (full, streamed):
        assert [block.type for block in message.content] == ["thinking", "text"]
        thinking, text = message.content[0].thinking, message.content[1].text
        # The block holds exactly BUDGET tokens, all fillers; then </think> was forced.
        assert thinking == " hmm" * BUDGET
        assert text == ANSWER and message.stop_reason == "end_turn"
        # <think>, the budget, the forced </think>, "\n\n" and the answer's tokens, and the EOS that ended it.
        assert message.usage.output_tokens == 1 + BUDGET + 1 + len(stubborn.encode("\n\n" + ANSWER)) + 1
    assert kinds.index("text_delta") > kinds.index("thinking_delta") and kinds[-1] == "text_delta"


async def test_without_a_budget_the_same_reasoner_runs_to_max_tokens(stubborn) -> None:
    with trio.fail_after(allowance(300)):
        async with running_server(stubborn) as server:
            def work(client: anthropic.Anthropic, model_id: str):
                return client.messages.create(model=model_id, messages=QUESTION, max_tokens=40,
                                              thinking={"type": "adaptive"}, extra_body={"temperature": 0.0})

            message = await in_worker(
                lambda: anthropic.Anthropic(base_url=f"http://{HOST}:{server.port}", api_key="unused",
                                            max_retries=0, timeout=allowance(300)),
                work, server.state.model_id)
    assert [block.type for block in message.content] == ["thinking"] and message.stop_reason == "max_tokens"


async def test_thinking_token_budget_cuts_reasoning_content_whole_and_streamed(stubborn) -> None:
    fields = dict(messages=QUESTION, max_tokens=200, temperature=0.0,
                  extra_body={"thinking_token_budget": 16, "chat_template_kwargs": {"enable_thinking": True}})
    with trio.fail_after(allowance(300)):
        async with running_server(stubborn) as server:
            def work(client: openai.OpenAI, model_id: str):
                full = client.chat.completions.create(model=model_id, **fields)
                reasoning, content = "", ""
                for chunk in client.chat.completions.create(model=model_id, stream=True, **fields):
                    for choice in chunk.choices:
                        reasoning += getattr(choice.delta, "reasoning_content", None) or ""
                        content += choice.delta.content or ""
                try:
                    client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8,
                                                   extra_body={"thinking_token_budget": -1})
                except openai.BadRequestError as exc:
                    refused = exc
                return full, reasoning, content, refused

            full, reasoning, content, refused = await in_worker(lambda: client_for(server), work,
                                                                server.state.model_id)
    message = full.choices[0].message
    assert message.reasoning_content == " hmm" * 16 and message.content == ANSWER
    assert full.choices[0].finish_reason == "stop"
    assert (reasoning, content) == (" hmm" * 16, ANSWER)
    assert refused.status_code == 400 and refused.body["param"] == "thinking_token_budget"


# ---- the rule, on stand-in models: what the budget needs of a vocabulary ----

@attrs.define
class _Vocab:
    tokens: dict

    def token_to_id(self, token: str):
        return self.tokens.get(token)


@attrs.define
class _Model:
    name: str
    tokens: dict

    @property
    def tokenizer(self):
        return _Vocab(self.tokens)

    def require_tokenizer(self):
        return self.tokenizer


def budgeted(**fields):
    chat = parse_chat_request(json.dumps({"messages": QUESTION}).encode())
    return attrs.evolve(chat, thinking=True, thinking_param="thinking", **fields)


QWEN3 = _Model("qwen3", {"<think>": 151667, "</think>": 151668})


def test_the_budget_names_the_markers_and_where_counting_starts() -> None:
    chat = budgeted(thinking_budget=2048)
    assert reasoning_budget(QWEN3, chat, "<|im_start|>assistant\n", closed=False) == ReasoningBudget(
        2048, 151668, open_token=151667, starts_inside=False)
    assert reasoning_budget(QWEN3, chat, "<|im_start|>assistant\n<think>\n", closed=False).starts_inside


def test_nothing_to_bound_where_the_block_is_closed_or_the_model_never_reasons() -> None:
    chat = budgeted(thinking_budget=2048)
    assert reasoning_budget(QWEN3, chat, "assistant\n<think>\n\n</think>\n\n", closed=True) is None
    assert reasoning_budget(_Model("smollm2", {}), chat, "assistant\n", closed=False) is None
    assert reasoning_budget(QWEN3, budgeted(), "assistant\n", closed=False) is None  # no budget asked


def test_a_reasoning_model_without_a_single_end_token_refuses_the_budget_naming_its_field() -> None:
    model = _Model("split-marker", {"<think>": 5})
    with pytest.raises(BadRequestError) as refused:
        reasoning_budget(model, budgeted(thinking_budget=2048, thinking_budget_param="thinking.budget_tokens"),
                         "assistant\n", closed=False)
    assert refused.value.param == "thinking.budget_tokens" and "</think>" in refused.value.message
