"""The tokenizer rebuilt from GGUF metadata gives the ids of the model's original tokenizer.json."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path

import pytest
import tokenizers

from kestrel_trio import load_model
from kestrel_trio.errors import KestrelError
from kestrel_trio.text import Tokenizer
from kestrel_trio.text.tokens.gguf_vocab import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNUSED, TOKEN_USER_DEFINED

from gguf_kit import TEXTS, assert_same_ids

GGUF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"


def gguf_metadata_from_tokenizer_json(spec: dict, vocab_size: int, pre: str) -> dict:
    """What llama.cpp's converter writes for a byte-level BPE tokenizer.json (its get_vocab_base)."""
    by_id = {i: t for t, i in spec["model"]["vocab"].items()}
    added = {t["id"]: t for t in spec["added_tokens"]}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in added:
            token = added[i]["content"]
            special = added[i]["special"] or (token.startswith("<|") and token.endswith("|>"))
            tokens.append(token)
            types.append(TOKEN_CONTROL if special else TOKEN_USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(TOKEN_NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges}


@pytest.fixture(scope="module")
def qwen3_tokenizer_json() -> dict:
    demo = resources.files("kestrel_trio") / "_demo" / "tokenizer.json.gz"
    return json.loads(gzip.decompress(demo.read_bytes()))


def test_qwen2_pre_tokenizer_reproduces_the_real_qwen3_tokenizer(qwen3_tokenizer_json):
    metadata = gguf_metadata_from_tokenizer_json(qwen3_tokenizer_json, 151936, "qwen2")
    metadata["tokenizer.ggml.eos_token_id"] = 151645
    ours = Tokenizer.from_gguf(metadata, "qwen3.gguf")
    original = tokenizers.Tokenizer.from_str(json.dumps(qwen3_tokenizer_json))
    assert_same_ids(ours, original)
    assert ours.vocab_size == original.get_vocab_size(with_added_tokens=True) == 151669  # no [PADn] fillers
    assert ours.eos_token_ids == {151645, 151643}  # eos_token_id, and <|endoftext|> as llama.cpp stops on it
    assert ours.special_tokens_map["eos_token"] == "<|im_end|>"
    assert ours.encode("<think>") == [151667] and 151667 not in ours.special_token_ids


def test_llama_bpe_pre_tokenizer_reproduces_the_fixture_tokenizer():
    """llama_quant.gguf's tokenizer was written by the converter's steps from this tokenizer.json."""
    original = tokenizers.Tokenizer.from_file(str(GGUF_FIXTURES / "llama_quant" / "tokenizer.json"))
    model = load_model(GGUF_FIXTURES / "llama_quant" / "llama_quant.gguf")
    assert_same_ids(model.tokenizer, original)
    pieces = [model.tokenizer.decode([i]) for i in model.tokenizer.encode("In 2024, at 10:30")]
    assert "202" in pieces and "4" in pieces  # digits split in threes before merging, as Llama 3 does


def test_chat_template_bos_and_eos_come_from_the_gguf():
    model = load_model(GGUF_FIXTURES / "llama_quant" / "llama_quant.gguf")
    prompt = model.apply_chat_template([{"role": "user", "content": " Hi "}])
    assert prompt == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n")
    tok = model.tokenizer
    assert tok.eos_token_ids == {tok.token_to_id("<|eot_id|>"), tok.token_to_id("<|end_of_text|>")}
    qwen = load_model(GGUF_FIXTURES / "qwen3_quant" / "qwen3_quant.gguf")
    rendered = qwen.apply_chat_template([{"role": "user", "content": "Hi"}], enable_thinking=False)
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert qwen.tokenizer.eos_token_ids == {qwen.tokenizer.token_to_id("<|im_end|>"),
                                            qwen.tokenizer.token_to_id("<|endoftext|>")}
    qwen_original = tokenizers.Tokenizer.from_file(
        str(Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied" / "tokenizer.json"))
    assert_same_ids(qwen.tokenizer, qwen_original)


def test_a_gguf_without_a_tokenizer_loads_for_token_ids():
    model = load_model(GGUF_FIXTURES / "qwen2_quant" / "qwen2_quant.gguf")
    assert model.tokenizer is None and model.logits([1, 2, 3]).shape == (3, 512)
    with pytest.raises(KestrelError, match="has no tokenizer metadata in its GGUF file, so it only takes token ids"):
        model.encode("hello")
