"""The spec extract catches what it must (so a clean result means something), and the sans-IO bodies conform."""

from __future__ import annotations

import copy

import pytest

from kestrel_trio import openai as oa
from kestrel_trio.errors import error_object
from kestrel_trio.openai.response.choices import CompletionChoice
from qwen3_choice import qwen3_choice as ChatChoice  # the output read as a Qwen3 model's
from kestrel_trio.openai.response.logprobs import LogprobToken, TokenLogprob

from openai_spec import SCHEMA_FILE, violations

CALL = ['<tool_call>\n{"name": "f", ', '"arguments": {"a": ', '1}}\n</tool_call>']


def entry(text: str) -> TokenLogprob:
    return TokenLogprob(LogprobToken(text.encode(), -0.25), (LogprobToken(b"x", -2.0),))


def chat_body(deltas, *, tools=False, logprobs=False, finish="stop"):
    choice = ChatChoice(0, parse_tools=tools, logprobs=logprobs, make_id=lambda: "call_1")
    items = list(choice.start())
    for text in deltas:
        items += choice.push(text, [entry(text)] if logprobs else [])
    items += choice.finish(finish)
    ident = ("chatcmpl-1", 1700000000, "m")
    body = oa.chat_completion_of(*ident, [choice.message_choice()], oa.Usage(3, len(deltas), 0))
    chunks = [oa.chat_chunk(*ident, [item], include_usage=True) for item in items]
    return body, chunks + [oa.chat_chunk_usage(*ident, oa.Usage(3, len(deltas)))]


def test_the_extract_names_the_spec_version_it_was_written_from():
    assert "OpenAPI spec, version 2.3.0" in SCHEMA_FILE.read_text()


@pytest.mark.parametrize("tools, logprobs, finish", [(False, False, "stop"), (True, True, "stop"),
                                                      (False, True, "length")])
def test_chat_bodies_and_chunks_conform(tools, logprobs, finish):
    body, chunks = chat_body(CALL if tools else ["Hel", "lo"], tools=tools, logprobs=logprobs, finish=finish)
    assert violations("chat_completion", body) == []
    assert [violations("chat_completion_chunk", chunk) for chunk in chunks] == [[]] * len(chunks)


def test_a_message_without_refusal_or_a_choice_without_logprobs_is_caught():
    body, _ = chat_body(["Hi"])
    without_refusal = copy.deepcopy(body)
    del without_refusal["choices"][0]["message"]["refusal"]
    assert violations("chat_completion", without_refusal) == ["choices/0/message: 'refusal' is a required property"]
    without_logprobs = copy.deepcopy(body)
    del without_logprobs["choices"][0]["logprobs"]
    assert violations("chat_completion", without_logprobs) == ["choices/0: 'logprobs' is a required property"]
    wrong = copy.deepcopy(body)
    wrong["choices"][0]["finish_reason"] = "eos"
    wrong["object"] = "chat.completions"
    assert len(violations("chat_completion", wrong)) == 2


def test_completions_models_and_errors_conform():
    choice = CompletionChoice(0, "echo ", logprobs=True)
    items = choice.start() + choice.push("a", [entry("a")]) + choice.finish("length")
    ident = ("cmpl-1", 1700000000, "m")
    assert violations("completion", oa.completion_of(*ident, [choice.full_choice()], oa.Usage(2, 1))) == []
    chunks = [oa.completion_chunk_of(*ident, [item], include_usage=True) for item in items]
    assert [violations("completion_chunk", chunk) for chunk in chunks] == [[]] * len(chunks)
    # Not a pass for anything: a chunk's finish_reason may be null, but not another word.
    assert violations("completion_chunk", {**chunks[-1], "choices": [{**items[-1], "finish_reason": "eos"}]})
    assert violations("model_list", oa.models_list(["m"], 1700000000, max_model_len=512)) == []
    assert violations("error", error_object("bad", "invalid_request_error", "messages")) == []
    assert violations("error", {"error": {"message": "bad", "type": "x"}}) == [
        "error: 'param' is a required property", "error: 'code' is a required property"]
