"""reasoning_effort and chat_template_kwargs.enable_thinking read into one reasoning choice."""

from __future__ import annotations

import json

import pytest

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai import parse_chat_request
from kestrel_trio.openai.request.thinking import REASONING_EFFORTS


def parse(**fields):
    return parse_chat_request(json.dumps({"messages": [{"role": "user", "content": "Hi"}], **fields}).encode())


@pytest.mark.parametrize("effort, thinking", [("none", False), ("minimal", False), ("low", True), ("medium", True),
                                              ("high", True), ("xhigh", True), ("max", True)])
def test_each_effort_is_reasoning_on_or_off(effort, thinking):
    request = parse(reasoning_effort=effort)
    assert (request.thinking, request.thinking_param) == (thinking, "reasoning_effort")
    assert request.chat_template_kwargs == {}


def test_the_efforts_are_the_openai_sdks():
    from typing import get_args

    from openai.types.shared.reasoning_effort import ReasoningEffort

    literal = next(arg for arg in get_args(ReasoningEffort) if get_args(arg))
    assert set(get_args(literal)) == set(REASONING_EFFORTS)


def test_unset_means_the_servers_default():
    assert parse().thinking is None and parse(reasoning_effort=None).thinking is None


def test_the_template_switch_and_an_agreeing_effort():
    request = parse(chat_template_kwargs={"enable_thinking": True}, reasoning_effort="high")
    assert (request.thinking, request.thinking_param) == (True, "chat_template_kwargs.enable_thinking")
    assert request.chat_template_kwargs == {}


@pytest.mark.parametrize("fields, param, words", [
    ({"reasoning_effort": "extreme"}, "reasoning_effort", "must be one of 'none', 'minimal'"),
    ({"reasoning_effort": 3}, "reasoning_effort", "got 3"),
    ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking", "a boolean"),
    ({"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low"}, "reasoning_effort",
     "disagree"),
])
def test_bad_or_disagreeing_fields_are_refused_by_name(fields, param, words):
    with pytest.raises(BadRequestError) as info:
        parse(**fields)
    assert info.value.param == param and words in info.value.message


@pytest.mark.parametrize("value", [0, 1, 4096])
def test_thinking_token_budget_is_the_requests_reasoning_budget(value):
    request = parse(thinking_token_budget=value)
    assert (request.thinking_budget, request.thinking_budget_param) == (value, "thinking_token_budget")
    assert parse().thinking_budget is None


@pytest.mark.parametrize("value", [-1, 1.5, "64", True])
def test_a_thinking_token_budget_that_is_not_a_count_is_refused_naming_it(value):
    with pytest.raises(BadRequestError) as refused:
        parse(thinking_token_budget=value)
    assert refused.value.param == "thinking_token_budget"
