"""parse_chat_request: structure, types, params named in errors."""

from __future__ import annotations

import json

import pytest

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai import parse_chat_request

USER = {"role": "user", "content": "hi"}


def body(**fields) -> bytes:
    fields.setdefault("messages", [USER])
    return json.dumps(fields).encode()


def rejected(raw: bytes, param: str | None, *fragments: str, **kwargs) -> BadRequestError:
    with pytest.raises(BadRequestError) as info:
        parse_chat_request(raw, **kwargs)
    assert info.value.param == param, info.value.message
    assert info.value.status == 400
    for fragment in fragments:
        assert fragment in info.value.message
    return info.value


def test_minimal_request_has_openai_defaults():
    request = parse_chat_request(body())
    assert request.model is None
    assert request.messages == ({"role": "user", "content": "hi"},)
    assert request.tools is None and request.tool_choice is None
    assert request.chat_template_kwargs == {}
    sampling = request.sampling
    assert (sampling.n, sampling.stream, sampling.include_usage, sampling.ignore_eos) == (1, False, False, False)
    assert sampling.stop == () and sampling.logit_bias == () and sampling.max_tokens is None
    assert sampling.as_dict() == {}


@pytest.mark.parametrize(
    "raw",
    [b"{", b"", b'{"a": 1,}', b"\xff\xfe{}", b'{"temperature": NaN}', b'{"t": -Infinity}', b"[1] x", "{}".encode("utf-16")],
)
def test_malformed_json_names_no_param(raw):
    error = rejected(raw, None)
    assert error.message.startswith("Request body is not valid JSON: ")


@pytest.mark.parametrize("raw", [b"[]", b'"text"', b"3", b"null"])
def test_body_must_be_an_object(raw):
    rejected(raw, None, "must be a JSON object")


def test_deeply_nested_json_is_a_bad_request_not_a_crash():
    rejected(b"[" * 100_000 + b"]" * 100_000, None, "not valid JSON")


def test_null_means_unset_for_every_known_field():
    optional = [
        "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids",
        "logit_bias", "n", "stream", "stream_options", "ignore_eos", "tools", "tool_choice", "chat_template_kwargs",
        "parallel_tool_calls", "logprobs", "top_logprobs",
        # no-ops and refused fields: null asks for nothing
        "user", "metadata", "store", "response_format", "service_tier", "audio", "functions", "reasoning_effort",
    ]
    raw = body(**{name: None for name in optional})
    request = parse_chat_request(raw)
    assert request == parse_chat_request(body())
    assert request.sampling.as_dict() == {}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", "0.5", "'temperature' must be a number, got string"),
        ("temperature", True, "'temperature' must be a number, got boolean"),
        ("top_p", [1], "'top_p' must be a number, got array"),
        ("min_p", {}, "'min_p' must be a number, got object"),
        ("presence_penalty", "1", "'presence_penalty' must be a number, got string"),
        ("frequency_penalty", False, "'frequency_penalty' must be a number, got boolean"),
        ("repetition_penalty", "x", "'repetition_penalty' must be a number, got string"),
        ("max_tokens", 1.5, "'max_tokens' must be an integer, got number"),
        ("max_tokens", 16.0, "'max_tokens' must be an integer, got number"),
        ("max_completion_tokens", "16", "'max_completion_tokens' must be an integer, got string"),
        ("seed", 1.25, "'seed' must be an integer, got number"),
        ("seed", True, "'seed' must be an integer, got boolean"),
        ("top_k", "20", "'top_k' must be an integer, got string"),
        ("n", True, "'n' must be an integer, got boolean"),
        ("stream", "true", "'stream' must be a boolean, got string"),
        ("stream", 1, "'stream' must be a boolean, got integer"),
        ("ignore_eos", 0, "'ignore_eos' must be a boolean, got integer"),
        ("model", 7, "'model' must be a string, got integer"),
        ("chat_template_kwargs", [], "'chat_template_kwargs' must be an object, got array"),
        ("logit_bias", [], "'logit_bias' must be an object, got array"),
        ("stop_token_ids", 5, "'stop_token_ids' must be an array, got integer"),
        ("stop", 5, "'stop' must be a string or an array of strings, got integer"),
    ],
)
def test_type_errors_name_the_field_and_the_expectation(field, value, message):
    error = rejected(body(**{field: value}), field)
    assert error.message == message


def test_integers_are_accepted_where_numbers_are():
    sampling = parse_chat_request(body(temperature=1, top_p=1, presence_penalty=-2)).sampling
    assert sampling.temperature == 1.0 and isinstance(sampling.temperature, float)
    assert isinstance(sampling.top_p, float) and sampling.presence_penalty == -2.0


def test_huge_number_is_rejected_not_turned_into_infinity():
    rejected(b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e999}', "temperature", "finite")
    rejected(body(temperature=10**400), "temperature", "finite")


def test_all_sampling_fields_are_read():
    sampling = parse_chat_request(
        body(
            max_tokens=10, temperature=0.7, top_p=0.8, top_k=20, min_p=0.05, presence_penalty=0.5,
            frequency_penalty=0.25, repetition_penalty=1.1, seed=42, stop=["###", "\n\n"], stop_token_ids=[151645],
            logit_bias={"5": 1, "10": -100.5}, n=1, stream=True, stream_options={"include_usage": True}, ignore_eos=True,
        )
    ).sampling
    assert sampling.as_dict() == {
        "max_tokens": 10, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05, "presence_penalty": 0.5,
        "frequency_penalty": 0.25, "repetition_penalty": 1.1, "seed": 42, "stop": ("###", "\n\n"),
        "stop_token_ids": (151645,), "logit_bias": ((5, 1.0), (10, -100.5)), "stream": True,
        "include_usage": True, "ignore_eos": True,
    }


def test_as_dict_keeps_explicit_zeroes():
    assert parse_chat_request(body(temperature=0, seed=0, top_k=0)).sampling.as_dict() == {
        "temperature": 0.0, "seed": 0, "top_k": 0,
    }


def test_max_completion_tokens_wins_over_max_tokens():
    assert parse_chat_request(body(max_tokens=5, max_completion_tokens=9)).sampling.max_tokens == 9
    assert parse_chat_request(body(max_tokens=5)).sampling.max_tokens == 5
    assert parse_chat_request(body(max_completion_tokens=7)).sampling.max_tokens == 7


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [0, -3])
def test_max_tokens_must_be_positive(field, value):
    rejected(body(**{field: value}), field, "at least 1")


def test_n():
    assert parse_chat_request(body(n=1)).sampling.n == 1
    rejected(body(n=0), "n", "at least 1")
    assert parse_chat_request(body(n=8)).sampling.n == 8
    rejected(body(n=9), "n", "at most 8")


def test_chat_logprobs_fields():
    assert parse_chat_request(body()).sampling.logprobs is None
    assert parse_chat_request(body(logprobs=False)).sampling.logprobs is None
    assert parse_chat_request(body(logprobs=True)).sampling.logprobs == 0
    assert parse_chat_request(body(logprobs=True, top_logprobs=20)).sampling.logprobs == 20
    rejected(body(top_logprobs=2), "top_logprobs", "'logprobs' set to true")
    rejected(body(logprobs=True, top_logprobs=21), "top_logprobs", "[0, 20]")
    rejected(body(logprobs=True, top_logprobs=-1), "top_logprobs", "[0, 20]")
    rejected(body(logprobs=1), "logprobs", "boolean")


def test_stop_forms():
    assert parse_chat_request(body(stop="END")).sampling.stop == ("END",)
    assert parse_chat_request(body(stop=["a", "b", "c", "d"])).sampling.stop == ("a", "b", "c", "d")
    assert parse_chat_request(body(stop=[])).sampling.stop == ()
    rejected(body(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4")
    rejected(body(stop=""), "stop", "empty")
    rejected(body(stop=["a", ""]), "stop[1]", "empty")
    rejected(body(stop=["a", 3]), "stop[1]", "must be a string, got integer")


def test_stop_token_ids():
    assert parse_chat_request(body(stop_token_ids=[1, 2])).sampling.stop_token_ids == (1, 2)
    rejected(body(stop_token_ids=[1, "2"]), "stop_token_ids[1]", "integer")
    rejected(body(stop_token_ids=[-1]), "stop_token_ids[0]", "non-negative")


@pytest.mark.parametrize("key", ["-1", "abc", "1.5", " 5", "+5", "", "\u0665"])
def test_logit_bias_keys_must_be_token_ids(key):
    rejected(body(logit_bias={key: 1}), f"logit_bias.{key}", "token ids")


def test_logit_bias_values_and_duplicates():
    rejected(body(logit_bias={"5": "1"}), "logit_bias.5", "must be a number, got string")
    rejected(body(logit_bias={"5": None}), "logit_bias.5", "must be a number, got null")
    rejected(body(logit_bias={"5": 1, "05": 2}), "logit_bias.05", "more than once")


def test_stream_options():
    sampling = parse_chat_request(body(stream=True, stream_options={"include_usage": True})).sampling
    assert sampling.stream and sampling.include_usage
    assert not parse_chat_request(body(stream=True, stream_options={})).sampling.include_usage
    assert not parse_chat_request(body(stream=True)).sampling.include_usage
    rejected(body(stream_options={"include_usage": True}), "stream_options", "'stream'")
    rejected(body(stream=False, stream_options={"include_usage": True}), "stream_options")
    rejected(body(stream=True, stream_options=[]), "stream_options", "must be an object")
    error = rejected(body(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage")
    assert error.message == "'stream_options.include_usage' must be a boolean, got string"


def test_chat_template_kwargs_and_model_pass_through():
    request = parse_chat_request(body(model="qwen3", chat_template_kwargs={"enable_thinking": False, "x": 1}))
    assert request.model == "qwen3"
    # The reasoning switch is the request's thinking choice, carried out per model; the rest goes to the template.
    assert request.chat_template_kwargs == {"x": 1}
    assert (request.thinking, request.thinking_param) == (False, "chat_template_kwargs.enable_thinking")


def test_repetition_guard_is_an_object_of_window_and_repeats_or_false() -> None:
    guard = {"window": 128, "repeats": 4}
    assert parse_chat_request(body(repetition_guard=guard)).sampling.repetition_guard == (128, 4)
    assert parse_chat_request(body(repetition_guard=False)).sampling.repetition_guard is False  # off, over a default
    assert parse_chat_request(body(repetition_guard=None)).sampling.repetition_guard is None  # the server's default
    refusals = [
        (True, "repetition_guard", "must be false or an object"),
        ({"window": 128}, "repetition_guard.repeats", "must be an integer"),
        ({"window": "128", "repeats": 4}, "repetition_guard.window", "must be an integer"),
        ({"window": 128, "repeats": 4, "period": 3}, "repetition_guard.period", "Unrecognized"),
    ]
    for value, param, message in refusals:
        with pytest.raises(BadRequestError, match=message) as info:
            parse_chat_request(body(repetition_guard=value))
        assert info.value.param == param
