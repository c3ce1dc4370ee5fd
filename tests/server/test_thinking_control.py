"""Reasoning on and off: reasoning_effort, chat_template_kwargs, Anthropic's thinking and serve(reasoning=...).

How each choice is carried out is read off the prompt the model got: its token count through the official
clients (Qwen3's closed reasoning block, ``<think>\\n\\n</think>\\n\\n``, is what "off" adds to the demo model's
prompt), and for the per-model rules, the plan and the finished prompt on models of each kind.
"""

from __future__ import annotations

import json

import anthropic
import attrs
import openai
import pytest
import trio

from kestrel_trio.app.chat.thinking import ThinkingPlan, check_reasoning_default, plan_thinking
from kestrel_trio.errors import BadRequestError, KestrelError
from kestrel_trio.model import Model
from kestrel_trio.openai import parse_chat_request
from kestrel_trio.server import serve
from kestrel_trio.text.tokens.chat_template import ChatTemplate

from server_kit import HOST, client_for, fetch, running_server

QUESTION = [{"role": "user", "content": "Why is the sky blue?"}]
CLOSED = "<think>\n\n</think>\n\n"


def chat(**fields):
    return parse_chat_request(json.dumps({"messages": QUESTION, **fields}).encode())


@attrs.define
class _Vocab:
    has_think: bool

    def token_to_id(self, token: str):
        return 7 if self.has_think and token == "<think>" else None


@attrs.define
class FakeModel:
    """Just what the plan reads of a model: its name, whether ``<think>`` is a token, its chat template."""

    name: str
    has_think: bool
    template: ChatTemplate

    @property
    def tokenizer(self):
        return _Vocab(self.has_think)

    def check_chat_template_kwargs(self, names, param="chat_template_kwargs"):
        self.template.check_kwargs(names, param)


# Jinja drops a template's final newline; an empty tag after it keeps the newline, as real templates' loops do.
_KEEP = "{% if false %}{% endif %}"
HYBRID = FakeModel("qwen3", True, ChatTemplate(
    "{{ messages[-1].content }}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}"))
ALWAYS = FakeModel("qwen3-thinking-2507", True, ChatTemplate("{{ messages[-1].content }}<|im_start|>assistant\n"
                                                             "<think>\n" + _KEEP))
INSTRUCT = FakeModel("qwen3-instruct-2507", True,
                     ChatTemplate("{{ messages[-1].content }}<|im_start|>assistant\n" + _KEEP))
PLAIN = FakeModel("smollm2", False, ChatTemplate("{{ messages[-1].content }}<|im_start|>assistant\n" + _KEEP))


def prompt_of(model: FakeModel, request, default: str = "auto") -> str:
    plan = plan_thinking(model, request, default)
    text = model.template.render(request.template_messages(), **plan.template_kwargs(request))
    return plan.finish_prompt(text)


@pytest.mark.parametrize("fields, default, ends", [
    ({}, "auto", "assistant\n"),
    ({"reasoning_effort": "none"}, "auto", "assistant\n" + CLOSED),
    ({"chat_template_kwargs": {"enable_thinking": False}}, "auto", "assistant\n" + CLOSED),
    ({}, "off", "assistant\n" + CLOSED),
    ({"reasoning_effort": "high"}, "off", "assistant\n"),
])
def test_a_hybrid_template_gets_the_switch(fields, default, ends):
    assert prompt_of(HYBRID, chat(**fields), default).endswith(ends)


def test_without_a_switch_off_closes_the_block_and_on_needs_the_template_to_open_it():
    assert prompt_of(ALWAYS, chat(reasoning_effort="none")).endswith("assistant\n" + CLOSED)
    assert prompt_of(ALWAYS, chat(reasoning_effort="high")).endswith("assistant\n<think>\n")
    assert prompt_of(INSTRUCT, chat(reasoning_effort="minimal")).endswith("assistant\n" + CLOSED)
    assert prompt_of(INSTRUCT, chat(), "on").endswith("assistant\n")  # a default, not a request: as it was
    with pytest.raises(BadRequestError) as info:
        prompt_of(INSTRUCT, chat(reasoning_effort="low"))
    assert info.value.param == "reasoning_effort" and "does not open a reasoning block" in info.value.message


def test_a_model_without_reasoning_refuses_only_an_explicit_on():
    for fields, default in (({"reasoning_effort": "none"}, "auto"), ({}, "on"), ({}, "off")):
        assert prompt_of(PLAIN, chat(**fields), default).endswith("assistant\n")
    with pytest.raises(BadRequestError) as info:
        prompt_of(PLAIN, chat(chat_template_kwargs={"enable_thinking": True}))
    assert info.value.param == "chat_template_kwargs.enable_thinking"
    assert "model 'smollm2' has no reasoning mode" in info.value.message


def test_the_server_default_must_be_a_mode():
    assert [check_reasoning_default(mode) for mode in ("auto", "on", "off")] == ["auto", "on", "off"]
    with pytest.raises(KestrelError, match="reasoning must be one of auto, on, off"):
        check_reasoning_default("sometimes")
    assert ThinkingPlan().finish_prompt("x") == "x"


async def test_the_official_clients_switch_reasoning_on_the_demo_model(demo_model: Model) -> None:
    """Off adds the closed block to the prompt (so many more prompt tokens); on and the default do not."""
    block = len(demo_model.encode(CLOSED))

    def work(server):
        client = client_for(server)

        def prompt_tokens(**fields) -> int:
            answer = client.chat.completions.create(model=server.state.model_id, messages=QUESTION, max_tokens=1,
                                                    **fields)
            return answer.usage.prompt_tokens

        counts = {"default": prompt_tokens(), "none": prompt_tokens(reasoning_effort="none"),
                  "high": prompt_tokens(reasoning_effort="high"),
                  "switch_off": prompt_tokens(extra_body={"chat_template_kwargs": {"enable_thinking": False}})}
        claude = anthropic.Anthropic(base_url=f"http://{HOST}:{server.port}", api_key="unused", max_retries=0)
        counts["anthropic_disabled"] = claude.messages.count_tokens(
            model=server.state.model_id, messages=QUESTION, thinking={"type": "disabled"}).input_tokens
        counts["anthropic_default"] = claude.messages.count_tokens(model=server.state.model_id,
                                                                   messages=QUESTION).input_tokens
        with pytest.raises(openai.BadRequestError) as info:
            prompt_tokens(reasoning_effort="high", extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        counts["conflict"] = info.value.body["param"]
        return counts

    with trio.fail_after(120):
        async with running_server(demo_model) as server:
            auto = await trio.to_thread.run_sync(work, server)
        async with running_server(demo_model, reasoning="off") as server:
            off = await trio.to_thread.run_sync(work, server)
    base = auto["default"]
    assert auto == {"default": base, "none": base + block, "high": base, "switch_off": base + block,
                    "anthropic_disabled": auto["anthropic_default"] + block,
                    "anthropic_default": auto["anthropic_default"], "conflict": "reasoning_effort"}
    # Under serve(reasoning="off") a request that says nothing gets no reasoning; one that asks still does.
    assert off == {**auto, "default": base + block,
                   "anthropic_default": auto["anthropic_default"] + block}


async def test_a_bad_reasoning_default_fails_before_listening(demo_model: Model) -> None:
    with pytest.raises(KestrelError, match="reasoning must be one of"):
        await serve(demo_model, host=HOST, port=0, reasoning="maybe")


async def test_the_route_refuses_reasoning_from_a_model_without_it(demo_model: Model, monkeypatch) -> None:
    """The demo model's vocabulary made to lack ``<think>`` and its template the switch: an explicit "on" is a 400
    naming the field, in each API's envelope; "off" and the defaults answer."""
    monkeypatch.setattr("kestrel_trio.app.chat.thinking.model_thinks", lambda model: False)
    monkeypatch.setattr("kestrel_trio.app.chat.thinking._has_switch", lambda model: False)
    body = {"messages": QUESTION, "max_tokens": 1}
    with trio.fail_after(120):
        async with running_server(demo_model, reasoning="on") as server:
            refused = await fetch(server.port, "POST", "/v1/chat/completions", {**body, "reasoning_effort": "low"})
            anthropic_refused = await fetch(server.port, "POST", "/v1/messages", {
                **body, "model": server.state.model_id, "max_tokens": 2048,
                "thinking": {"type": "enabled", "budget_tokens": 1024}})
            answered = [await fetch(server.port, "POST", "/v1/chat/completions", {**body, **extra})
                        for extra in ({}, {"reasoning_effort": "none"})]
            model_id = server.state.model_id
            responses_refused = await fetch(server.port, "POST", "/v1/responses", {
                "model": model_id, "input": QUESTION, "max_output_tokens": 1, "reasoning": {"effort": "low"}})
            ollama_refused = await fetch(server.port, "POST", "/api/chat", {
                "model": model_id, "messages": QUESTION, "think": True, "stream": False})
    assert refused.status == 400 and refused.json()["error"]["param"] == "reasoning_effort"
    assert "has no reasoning mode" in refused.json()["error"]["message"]
    assert anthropic_refused.status == 400
    assert anthropic_refused.json()["error"]["type"] == "invalid_request_error"
    assert "'thinking' asks for reasoning" in anthropic_refused.json()["error"]["message"]
    assert [response.status for response in answered] == [200, 200]
    assert responses_refused.status == 400 and responses_refused.json()["error"]["param"] == "reasoning.effort"
    assert "'reasoning.effort' asks for reasoning" in responses_refused.json()["error"]["message"]
    assert ollama_refused.status == 400 and list(ollama_refused.json()) == ["error"]  # Ollama's error shape
    assert "'think' asks for reasoning" in ollama_refused.json()["error"]


async def test_every_api_closes_the_block_on_a_template_without_the_switch(demo_model: Model, monkeypatch) -> None:
    """The demo model's template made to lack the switch: "off" from chat, Responses and Ollama alike adds the
    closed block to the prompt (one plan decides for all), and nothing asked leaves the prompt as it is."""
    monkeypatch.setattr("kestrel_trio.app.chat.thinking._has_switch", lambda model: False)
    block = len(demo_model.encode(CLOSED))

    async def counts(server, off: bool) -> list[int]:
        model_id = server.state.model_id
        chat = await fetch(server.port, "POST", "/v1/chat/completions", {
            "messages": QUESTION, "max_tokens": 1, **({"reasoning_effort": "none"} if off else {})})
        responses = await fetch(server.port, "POST", "/v1/responses/input_tokens", {
            "model": model_id, "input": QUESTION, **({"reasoning": {"effort": "none"}} if off else {})})
        ollama = await fetch(server.port, "POST", "/api/chat", {
            "model": model_id, "messages": QUESTION, "stream": False, "options": {"num_predict": 1},
            **({"think": False} if off else {})})
        return [chat.json()["usage"]["prompt_tokens"], responses.json()["input_tokens"],
                ollama.json()["prompt_eval_count"]]

    with trio.fail_after(120):
        async with running_server(demo_model) as server:
            default, off = await counts(server, False), await counts(server, True)
    assert default == [default[0]] * 3 and block > 0
    assert off == [default[0] + block] * 3


async def test_smollm2_has_no_reasoning_so_only_asking_for_it_is_refused() -> None:
    from kestrel_trio import load_model

    from real_models import smollm2_135m

    smollm2 = load_model(smollm2_135m())

    def work(server):
        client = client_for(server)

        def prompt_tokens(**fields) -> int:
            return client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=1,
                                                  **fields).usage.prompt_tokens

        counts = [prompt_tokens(), prompt_tokens(reasoning_effort="none"),
                  prompt_tokens(extra_body={"chat_template_kwargs": {"enable_thinking": False}})]
        with pytest.raises(openai.BadRequestError) as info:
            prompt_tokens(reasoning_effort="medium")
        return counts, info.value

    with trio.fail_after(300):
        async with running_server(smollm2, model_id="smollm2", reasoning="on") as server:
            counts, refusal = await trio.to_thread.run_sync(work, server)
    assert counts == [counts[0]] * 3  # off holds as it is; the server's "on" leaves the default as it was
    assert refusal.body["param"] == "reasoning_effort" and "has no reasoning mode" in refusal.body["message"]


async def test_tokenize_counts_what_chat_gets_under_each_reasoning_choice(demo_model: Model) -> None:
    cases = ({}, {"chat_template_kwargs": {"enable_thinking": False}},
             {"chat_template_kwargs": {"enable_thinking": True}})
    with trio.fail_after(120):
        async with running_server(demo_model, reasoning="off") as server:
            pairs = []
            for fields in cases:
                counted = await fetch(server.port, "POST", "/tokenize", {"messages": QUESTION, **fields})
                chat = await fetch(server.port, "POST", "/v1/chat/completions",
                                   {"messages": QUESTION, "max_tokens": 1, **fields})
                pairs.append((counted.json()["count"], chat.json()["usage"]["prompt_tokens"]))
    assert [count for count, _ in pairs] == [prompt for _, prompt in pairs]
    block = len(demo_model.encode(CLOSED))
    assert pairs[0][0] == pairs[1][0] == pairs[2][0] + block  # the server's off, asked off, asked on
