"""Coverage-guided fuzzing (atheris/libFuzzer) of request bodies, up to the point where a request is queued.

Usage (atheris is not a project dependency; it has a manylinux wheel for CPython 3.11):
    pip install --target /tmp/atheris-lib atheris
    PYTHONPATH=/tmp/atheris-lib python benchmarks/server/fuzz_atheris.py -max_total_time=120

Each input is a request body for /v1/chat/completions (first byte even) or
/v1/completions (odd). It goes through the same synchronous steps the routes
run before queuing: parsing and validation, the chat template, tokenization,
token-id and context checks. Any exception other than a KestrelError is a
finding (the server would answer it with a 500). The fixture checkpoint
(context 512) keeps each run fast. Not run in CI: tests/reliability/
test_fuzz_server.py is the hypothesis version over real sockets. A libFuzzer
dictionary of the API's field names is written beside the corpus and used.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from kestrel_trio import openai as oa
    from kestrel_trio.errors import KestrelError
    from kestrel_trio.model import load_model
    from kestrel_trio.text.context_length import check_context

MODEL = load_model(Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "qwen3_bf16_tied")
SEEDS = [
    b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}',
    b'{"prompt": "Once", "max_tokens": 2, "stop": ["x"], "logit_bias": {"5": 1}}',
    b'{"prompt": [1, 2, 3], "max_tokens": 1, "echo": true, "stream": true, "stream_options": {"include_usage": true}}',
    (b'{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"}]}],'
     b' "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],'
     b' "chat_template_kwargs": {"enable_thinking": false}}'),
]


FIELDS = ["messages", "role", "content", "user", "assistant", "system", "tool", "tool_calls", "tool_call_id",
          "function", "arguments", "name", "type", "text", "image_url", "prompt", "model", "max_tokens",
          "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
          "logit_bias", "n", "stream", "stream_options", "include_usage", "echo", "suffix", "best_of", "ignore_eos",
          "tools", "tool_choice", "parameters", "chat_template_kwargs", "enable_thinking", "add_generation_prompt",
          "repetition_penalty", "presence_penalty", "frequency_penalty"]
TOKENS = [f'"{field}"' for field in FIELDS] + ["null", "true", "false", "[]", "{}", "1e308", "-1", "18446744073709551616",
                                               '"\\ud800"', '":"', '","']


def prepare(data: bytes) -> None:
    """What the routes do with a body before it reaches the engine."""
    if not data:
        return
    body = data[1:]
    if data[0] % 2 == 0:
        chat = oa.parse_chat_request(body)
        prompt = MODEL.apply_chat_template(chat.template_messages(), add_generation_prompt=True,
                                           tools=list(chat.tools) if chat.tools else None, **chat.chat_template_kwargs)
        ids = MODEL.encode(prompt)
        check_context(len(ids), chat.sampling.max_tokens, MODEL.context_length, param="messages")
    else:
        request = oa.parse_completion_request(body)
        if isinstance(request.prompt, str):
            ids = MODEL.encode(request.prompt)
        else:
            ids = list(request.prompt)
            MODEL.check_token_ids(ids, param="prompt")
        check_context(len(ids), request.sampling.max_tokens, MODEL.context_length, param="prompt")


def test_one_input(data: bytes) -> None:
    try:
        prepare(data)
    except KestrelError:
        pass


def main() -> None:
    corpus = Path("/tmp/kestrel-atheris-corpus")
    corpus.mkdir(exist_ok=True)
    for index, seed in enumerate(SEEDS):
        for lead in (b"\x00", b"\x01"):
            (corpus / f"seed{index}{lead.hex()}").write_bytes(lead + seed)
    dictionary = corpus.with_suffix(".dict")
    dictionary.write_text("".join(f"{json.dumps(token)}\n" for token in TOKENS))
    atheris.Setup([*sys.argv, f"-dict={dictionary}", f"-artifact_prefix={corpus}-", str(corpus)], test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
