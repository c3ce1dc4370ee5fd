"""Response bodies: exact shapes, and acceptance by the official openai client's types."""

from __future__ import annotations

import json
import re

import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from kestrel_trio.openai import (
    Usage,
    chat_chunk,
    chat_chunk_usage,
    chat_completion_of,
    completion_chunk_of,
    completion_chunk_usage,
    completion_of,
    model_card,
    models_list,
    new_id,
    to_json_bytes,
    usage_dict,
)

ID, CREATED, MODEL = "chatcmpl-abc", 1_700_000_000, "qwen3-0.6b"


def message_choice(content, finish_reason, **extra) -> dict:
    return {"index": 0, "message": {"role": "assistant", "content": content, **extra}, "logprobs": None,
            "finish_reason": finish_reason}


def delta_choice(delta: dict, finish_reason=None) -> dict:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def test_usage():
    usage = Usage(prompt_tokens=7, completion_tokens=5)
    assert usage.total_tokens == 12
    assert usage_dict(usage) == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    cached = usage_dict(Usage(7, 5, cached_tokens=4))
    assert cached["prompt_tokens_details"] == {"cached_tokens": 4} and cached["total_tokens"] == 12


def test_chat_completion_shape():
    body = chat_completion_of(ID, CREATED, MODEL, [message_choice("Hello", "stop")], Usage(3, 2))
    assert body == {
        "id": ID,
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hello"}, "logprobs": None, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    parsed = ChatCompletion.model_validate(body)
    assert parsed.choices[0].message.content == "Hello"
    assert parsed.usage is not None and parsed.usage.total_tokens == 5


def test_chat_completion_with_reasoning_and_cached_tokens_is_accepted_by_the_client():
    choice = message_choice(None, "length", reasoning_content="thinking")
    body = chat_completion_of(ID, CREATED, MODEL, [choice], Usage(3, 2, cached_tokens=1))
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 1}
    parsed = ChatCompletion.model_validate(body)
    assert parsed.usage.prompt_tokens_details.cached_tokens == 1


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream_chunks(include_usage):
    deltas = [{"role": "assistant", "content": ""}, {"reasoning_content": "hmm"}, {"content": "Hi"}, {}]
    finishes = [None, None, None, "stop"]
    chunks = [chat_chunk(ID, CREATED, MODEL, [delta_choice(d, f)], include_usage=include_usage)
              for d, f in zip(deltas, finishes)]
    assert [c["choices"][0]["delta"] for c in chunks] == deltas
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        assert (chunk["id"], chunk["created"], chunk["model"]) == (ID, CREATED, MODEL)
        assert ("usage" in chunk) is include_usage
        if include_usage:
            assert chunk["usage"] is None
        ChatCompletionChunk.model_validate(chunk)


def test_chat_usage_chunk():
    chunk = chat_chunk_usage(ID, CREATED, MODEL, Usage(10, 4))
    assert chunk == {
        "id": ID, "object": "chat.completion.chunk", "created": CREATED, "model": MODEL, "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
    }
    assert ChatCompletionChunk.model_validate(chunk).usage.completion_tokens == 4


def test_completion_shapes():
    choice = {"text": "text", "index": 0, "logprobs": None, "finish_reason": "length"}
    body = completion_of("cmpl-1", CREATED, MODEL, [choice], Usage(2, 16))
    assert body == {
        "id": "cmpl-1", "object": "text_completion", "created": CREATED, "model": MODEL,
        "choices": [{"text": "text", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 16, "total_tokens": 18},
    }
    Completion.model_validate(body)
    middle = completion_chunk_of("cmpl-1", CREATED, MODEL, [{**choice, "text": "te", "finish_reason": None}],
                                 include_usage=True)
    last = completion_chunk_of("cmpl-1", CREATED, MODEL, [{**choice, "text": "", "finish_reason": "stop"}])
    assert middle["usage"] is None and "usage" not in last
    usage_chunk = completion_chunk_usage("cmpl-1", CREATED, MODEL, Usage(2, 2))
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["total_tokens"] == 4
    # The client's Completion type insists on a finish_reason, yet OpenAI streams
    # null ones mid-stream (the client builds stream chunks without validation).
    for chunk in (last, usage_chunk):
        Completion.model_validate(chunk)


def test_models():
    listing = models_list(["a", "b"], CREATED)
    assert listing == {
        "object": "list",
        "data": [
            {"id": "a", "object": "model", "created": CREATED, "owned_by": "kestrel-trio"},
            {"id": "b", "object": "model", "created": CREATED, "owned_by": "kestrel-trio"},
        ],
    }
    for card in listing["data"]:
        Model.model_validate(card)
    assert model_card("a", CREATED, "me", max_model_len=4096) == {
        "id": "a", "object": "model", "created": CREATED, "owned_by": "me", "max_model_len": 4096,
    }


def test_new_id():
    ids = {new_id("chatcmpl") for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", i) for i in ids)
    assert re.fullmatch(r"cmpl-[0-9a-f]{24}", new_id("cmpl"))


@pytest.mark.parametrize("text", ["a\nb", "a\rb", "a\u2028b\u2029c", "tab\there", "nel\x85", "emoji 😀", "中文", 'q"\\'])
def test_to_json_bytes_is_one_compact_line_and_round_trips(text):
    obj = {"content": text, "n": [1, 2.5, None, True]}
    data = to_json_bytes(obj)
    decoded = data.decode("utf-8")
    assert len(decoded.splitlines()) == 1
    assert b"\n" not in data and b"\r" not in data
    assert json.loads(data) == obj
    assert ", " not in decoded and ": " not in decoded


def test_to_json_bytes_keeps_non_ascii_raw():
    assert to_json_bytes({"t": "中😀"}) == '{"t":"中😀"}'.encode()
