"""parse_completion_request, parse_tokenize_request and parse_detokenize_request."""

from __future__ import annotations

import json

import pytest

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai import (
    parse_completion_request,
    parse_detokenize_request,
    parse_tokenize_request,
)


def raw(**fields) -> bytes:
    return json.dumps(fields).encode()


def rejected(parser, body: bytes, param: str | None, *fragments: str) -> BadRequestError:
    with pytest.raises(BadRequestError) as info:
        parser(body)
    assert info.value.param == param, info.value.message
    for fragment in fragments:
        assert fragment in info.value.message
    return info.value


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("Once upon", "Once upon"),
        (["Once upon"], "Once upon"),
        ([1, 2, 3], (1, 2, 3)),
        ([[4, 5]], (4, 5)),
    ],
)
def test_prompt_forms(prompt, expected):
    request = parse_completion_request(raw(prompt=prompt, model="m"))
    assert request.prompt == expected
    assert request.model == "m" and request.echo is False and request.suffix is None


@pytest.mark.parametrize(
    ("prompt", "param", "fragment"),
    [
        ("", "prompt", "empty"),
        ([], "prompt", "empty"),
        ([""], "prompt[0]", "empty"),
        ([[]], "prompt[0]", "empty"),
        (["a", "b"], "prompt", "batched prompts are not supported"),
        ([[1], [2]], "prompt", "batched prompts are not supported"),
        ([1, "a"], "prompt[1]", "must be an integer, got string"),
        ([1, True], "prompt[1]", "must be an integer, got boolean"),
        ([[1, -2]], "prompt[0][1]", "non-negative"),
        ([1.5], "prompt[0]", "integer"),
        (5, "prompt", "got integer"),
        ({"text": "x"}, "prompt", "got object"),
    ],
)
def test_bad_prompts(prompt, param, fragment):
    rejected(parse_completion_request, raw(prompt=prompt), param, fragment)


def test_prompt_is_required():
    rejected(parse_completion_request, raw(), "prompt", "required")
    rejected(parse_completion_request, raw(prompt=None), "prompt", "required")


def test_completion_fields():
    request = parse_completion_request(raw(prompt="x", echo=True, suffix=None, best_of=1, max_tokens=3))
    assert request.echo is True
    assert request.sampling.max_tokens == 3
    # max_completion_tokens belongs to the chat endpoint only: here it would be ignored, so it is refused.
    rejected(parse_completion_request, raw(prompt="x", max_completion_tokens=99), "max_completion_tokens",
             "Unrecognized")
    rejected(parse_completion_request, raw(prompt="x", suffix="end"), "suffix", "not supported")
    rejected(parse_completion_request, raw(prompt="x", best_of=2), "best_of", "not supported")
    rejected(parse_completion_request, raw(prompt="x", echo="yes"), "echo", "boolean")
    assert parse_completion_request(raw(prompt="x", n=3)).sampling.n == 3
    rejected(parse_completion_request, raw(prompt="x", n=9), "n", "at most 8")
    assert parse_completion_request(raw(prompt="x")).sampling.logprobs is None
    assert parse_completion_request(raw(prompt="x", logprobs=0)).sampling.logprobs == 0
    assert parse_completion_request(raw(prompt="x", logprobs=5)).sampling.logprobs == 5
    rejected(parse_completion_request, raw(prompt="x", logprobs=6), "logprobs", "[0, 5]")
    rejected(parse_completion_request, raw(prompt="x", logprobs=True), "logprobs", "integer")
    rejected(parse_completion_request, b"not json", None, "not valid JSON")


def test_tokenize_prompt_and_messages():
    prompt = parse_tokenize_request(raw(prompt="hello", model="m"))
    assert (prompt.model, prompt.prompt, prompt.messages) == ("m", "hello", None)
    chat = parse_tokenize_request(raw(messages=[{"role": "developer", "content": "x"}], add_generation_prompt=False,
                                      chat_template_kwargs={"enable_thinking": False}))
    assert chat.prompt is None
    assert chat.messages == ({"role": "system", "content": "x"},)
    assert chat.add_generation_prompt is False
    assert chat.chat_template_kwargs == {} and chat.thinking is False  # the reasoning choice, as in chat
    assert parse_tokenize_request(raw(messages=[{"role": "user", "content": "x"}])).add_generation_prompt is True


def test_tokenize_renders_tools_as_chat_does():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    chat = parse_tokenize_request(raw(messages=[{"role": "assistant", "tool_calls": [call]}], tools=tools))
    assert chat.tools == tuple(tools)
    assert chat.template_messages()[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}  # as chat's
    assert parse_tokenize_request(raw(messages=[{"role": "user", "content": "x"}])).tools is None
    rejected(parse_tokenize_request, raw(messages=[{"role": "user", "content": "x"}], tools=[{"type": "function"}]),
             "tools[0].function", "required")
    rejected(parse_tokenize_request, raw(prompt="a", tools=tools), "tools", "only with 'messages'")


def test_tokenize_errors():
    rejected(parse_tokenize_request, raw(), "prompt", "Exactly one")
    rejected(parse_tokenize_request, raw(prompt="a", messages=[{"role": "user", "content": "x"}]), "prompt", "Exactly one")
    rejected(parse_tokenize_request, raw(prompt=3), "prompt", "string")
    rejected(parse_tokenize_request, raw(messages=[{"role": "user"}]), "messages[0].content", "required")
    rejected(parse_tokenize_request, raw(messages=[{"role": "user", "content": "x"}], add_generation_prompt="no"),
             "add_generation_prompt", "boolean")
    # Template fields beside a prompt would be ignored, so they are refused.
    rejected(parse_tokenize_request, raw(prompt="a", add_generation_prompt=False), "add_generation_prompt",
             "only with 'messages'")
    rejected(parse_tokenize_request, raw(prompt="a", chat_template_kwargs={"enable_thinking": False}),
             "chat_template_kwargs", "only with 'messages'")
    rejected(parse_tokenize_request, raw(prompt="a", add_special_tokens=True), "add_special_tokens", "Unrecognized")
    rejected(parse_detokenize_request, raw(tokens=[1], skip_special_tokens=True), "skip_special_tokens",
             "Unrecognized")


def test_detokenize():
    assert parse_detokenize_request(raw(tokens=[1, 2, 3])).tokens == (1, 2, 3)
    assert parse_detokenize_request(raw(tokens=[], model="m")).model == "m"
    rejected(parse_detokenize_request, raw(), "tokens", "required")
    rejected(parse_detokenize_request, raw(tokens="1 2"), "tokens", "array")
    rejected(parse_detokenize_request, raw(tokens=[1, "2"]), "tokens[1]", "integer")
    rejected(parse_detokenize_request, raw(tokens=[-1]), "tokens[0]", "non-negative")


def test_default_max_tokens_follows_openai_under_the_server_cap():
    from kestrel_trio.openai import COMPLETIONS_DEFAULT_MAX_TOKENS, default_max_tokens

    assert COMPLETIONS_DEFAULT_MAX_TOKENS == 16
    assert default_max_tokens(chat=True, server_cap=None) is None  # up to the context
    assert default_max_tokens(chat=False, server_cap=None) == 16
    assert default_max_tokens(chat=True, server_cap=300) == 300
    assert default_max_tokens(chat=False, server_cap=300) == 16  # the cap never raises OpenAI's 16
    assert default_max_tokens(chat=False, server_cap=4) == 4
