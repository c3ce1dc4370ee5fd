"""Ollama request bodies -> the server's chat request, and Ollama's response shapes (sans-IO)."""

from __future__ import annotations

import json

import pytest

from kestrel_trio import ollama as ol
from kestrel_trio.errors import BadRequestError


def chat(**body) -> ol.OllamaChat:
    body.setdefault("model", "m")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return ol.parse_chat(json.dumps(body).encode())


def generate(**body) -> ol.OllamaGenerate:
    body.setdefault("model", "m")
    return ol.parse_generate(json.dumps(body).encode())


def refused(parse, match: str, **body) -> BadRequestError:
    with pytest.raises(BadRequestError, match=match) as caught:
        parse(**body)
    return caught.value


def test_streaming_is_the_default_and_options_map_to_sampling() -> None:
    assert chat().chat.sampling.stream is True and chat(stream=False).chat.sampling.stream is False
    sampling = chat(options={"temperature": 0.2, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 7,
                             "num_predict": 12, "stop": ["\n\n", "END"], "repeat_penalty": 1.1,
                             "presence_penalty": 0.5, "frequency_penalty": 0.25}).chat.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.seed) == (
        0.2, 0.9, 20, 0.05, 7)
    assert sampling.max_tokens == 12 and sampling.max_tokens_param == "options.num_predict"
    assert sampling.stop == ("\n\n", "END") and sampling.repetition_penalty == 1.1
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, 0.25)
    assert chat(options={"num_predict": -1}).chat.sampling.max_tokens is None  # no limit: the context's end
    assert chat(options={"num_predict": -2}).chat.sampling.max_tokens is None
    assert chat(options={"top_k": 0}).chat.sampling.top_k is None  # Ollama's 0: no cut
    assert chat(options={"stop": "END"}).chat.sampling.stop == ("END",)


def test_runtime_options_are_accepted_and_unimplemented_samplers_only_neutral() -> None:
    assert chat(options={"num_ctx": 8192, "num_thread": 4, "num_gpu": 0, "use_mmap": True}).chat.sampling.stream
    assert chat(options={"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0, "repeat_last_n": -1}).chat
    assert chat(options={"mirostat_tau": 5.0, "mirostat_eta": 0.1}).chat  # tuning a sampler that is off
    refused(chat, "mirostat_tau", options={"mirostat_tau": "high"})
    assert refused(chat, "options.mirostat", options={"mirostat": 2}).param == "options.mirostat"
    assert refused(chat, "options.repeat_last_n", options={"repeat_last_n": 64}).param == "options.repeat_last_n"
    assert refused(chat, "options.temprature", options={"temprature": 0.5}).param == "options.temprature"
    assert refused(chat, "num_predict", options={"num_predict": 0}).param == "options.num_predict"
    assert refused(chat, "top_p", options={"top_p": 1.5}).param == "options.top_p"


def test_messages_translate_to_the_chat_request() -> None:
    req = chat(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?", "images": ["QUJD"]},
        {"role": "assistant", "content": "", "thinking": "Call the tool.",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "18 degrees"},
    ])
    system, user, assistant, tool = req.chat.messages
    assert system == {"role": "system", "content": "Be brief."}
    assert user["content"] == [{"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                               {"type": "text", "text": "Weather?"}]  # images first, as Ollama places them
    [call] = assistant["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert assistant["reasoning_content"] == "Call the tool." and assistant["content"] is None
    assert tool == {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees"}


def test_format_think_tools_and_keep_alive() -> None:
    assert chat(format="json").chat.structured.kind == "json_object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    structured = chat(format=schema).chat.structured
    assert (structured.kind, structured.schema, structured.param) == ("json_schema", schema, "format")
    assert chat(format="").chat.structured is None
    assert chat(think=True).think is True and chat(think=False).think is False and chat().think is None
    assert chat(think="high").think is True
    refused(chat, "think", think="max")
    tools = chat(tools=[{"type": "function", "function": {"name": "f"}}]).chat.tools
    assert tools == ({"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                    "properties": {}}}},)
    assert chat(keep_alive="5m").chat and chat(keep_alive=0).chat
    refused(chat, "keep_alive", keep_alive=True)


def test_generate_translates_prompt_system_and_raw() -> None:
    req = generate(prompt="Hi", system="Be brief.", images=["QUJD"], stream=False)
    assert [m["role"] for m in req.request.chat.messages] == ["system", "user"]
    assert req.raw_prompt is None and not req.empty and req.request.chat.sampling.stream is False
    assert generate(prompt="<|im_start|>x", raw=True).raw_prompt == "<|im_start|>x"
    assert generate().empty and chat(messages=[]).empty
    refused(generate, "raw", prompt="x", raw=True, system="s")
    refused(generate, "raw", prompt="x", raw=True, think=False)


@pytest.mark.parametrize(("key", "value"), [("suffix", "x"), ("template", "{{ .Prompt }}"), ("context", [1, 2]),
                                            ("logprobs", True), ("best_of", 2)])
def test_fields_that_would_change_the_answer_are_refused(key: str, value) -> None:
    assert refused(generate, key, prompt="x", **{key: value}).param == key


def test_unsupported_fields_at_their_unset_value_pass() -> None:
    assert generate(prompt="x", suffix="", context=[], logprobs=False).raw_prompt is None


def test_embed_bodies() -> None:
    body = ol.parse_embed(json.dumps({"model": "m", "input": ["a", "b"], "dimensions": 8,
                                      "truncate": False}).encode())
    assert (body.texts, body.dimensions, body.truncate) == (("a", "b"), 8, False)
    assert ol.parse_embed(json.dumps({"model": "m", "input": "a"}).encode()).texts == ("a",)
    legacy = ol.parse_embed(json.dumps({"model": "m", "prompt": "a"}).encode(), legacy=True)
    assert legacy.texts == ("a",) and legacy.legacy
    with pytest.raises(BadRequestError, match="input\\[1\\]"):
        ol.parse_embed(json.dumps({"model": "m", "input": ["a", ""]}).encode())
    with pytest.raises(BadRequestError, match="dimensions"):
        ol.parse_embed(json.dumps({"model": "m", "input": "a", "dimensions": 0}).encode())


def test_final_fields_are_nanoseconds_from_the_timings() -> None:
    timings = ol.Timings(started=1_000)
    timings.token(5_000, prompt_tokens=9, completion_tokens=1)
    timings.token(9_000, prompt_tokens=9, completion_tokens=3)
    assert ol.final_fields("stop", timings, now=10_000) == {
        "done": True, "done_reason": "stop", "total_duration": 9_000, "load_duration": 0,
        "prompt_eval_count": 9, "prompt_eval_duration": 4_000, "eval_count": 3, "eval_duration": 4_000}


def test_names_and_tool_call_shapes() -> None:
    assert ol.listed_name("qwen3") == "qwen3:latest" and ol.listed_name("qwen3:0.6b") == "qwen3:0.6b"
    assert ol.names_of("Qwen/Qwen3-0.6B") == {"Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B:latest"}
    calls = ol.tool_calls([{"id": "call_1", "function": {"name": "f", "arguments": '{"a": 1}'}}])
    assert calls == [{"id": "call_1", "function": {"index": 0, "name": "f", "arguments": {"a": 1}}}]
    assert ol.ndjson_line({"a": "é"}) == '{"a":"é"}\n'.encode()
