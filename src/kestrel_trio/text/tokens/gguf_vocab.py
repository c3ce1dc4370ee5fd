"""A ``tokenizers`` byte-level BPE rebuilt from a GGUF file's tokenizer metadata.

llama.cpp's converter writes a Hugging Face tokenizer into GGUF as lists:
``tokenizer.ggml.tokens`` (every id's token, byte-level spelling, ``[PADn]``
for ids the original lacks), ``tokenizer.ggml.token_type`` (1 normal, 3
control: added tokens marked special or shaped like ``<|...|>``, 4
user-defined: other added tokens, 5 unused: the pads), ``tokenizer.ggml.merges``
(``"a b"`` strings, in rank order), and ``tokenizer.ggml.pre``, a name for the
original's pre-tokenizer that the converter recognised by hashing its output.

This module rebuilds the original tokenizer.json from those: the vocabulary
and merges as stored, control and user-defined tokens as added tokens at their
ids (special and not), and, for each supported pre-tokenizer name, the
normalizer, pre-tokenizer and BPE options of the family's own tokenizer.json,
so that ids equal the original's. What GGUF does not keep: whether a
``<|...|>`` added token was special (the converter marks all of them control,
so all are special here: they are skipped when decoding with
``skip_special_tokens``; encoding is unaffected).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers

from kestrel_trio.errors import ModelLoadError

__all__ = ["PRE_TOKENIZERS", "TOKEN_NORMAL", "TOKEN_CONTROL", "TOKEN_USER_DEFINED", "TOKEN_UNUSED",
           "tokenizer_json_from_gguf", "backend_from_gguf", "special_tokens_from_gguf"]

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(pattern: str, trim_offsets: bool) -> dict[str, Any]:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim_offsets, "use_regex": False},
    ]}


# tokenizer.ggml.pre -> the (normalizer, pre_tokenizer, BPE ignore_merges) of that family's tokenizer.json.
PRE_TOKENIZERS: dict[str, tuple[dict[str, Any] | None, dict[str, Any], bool]] = {
    # Qwen1.5 to Qwen3: NFC, then single digits and Qwen's word pattern.
    "qwen2": ({"type": "NFC"}, _split_then_bytes(_QWEN2_SPLIT, trim_offsets=False), False),
    # Llama 3.x: digits in threes; its BPE takes a whole word that is in the vocabulary without merging.
    "llama-bpe": (None, _split_then_bytes(_LLAMA3_SPLIT, trim_offsets=True), True),
    # SmolLM / SmolLM2: every digit on its own, then GPT-2's pattern.
    "smollm": (None, {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ]}, False),
}
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def _strings(metadata: Mapping[str, Any], key: str, source: str) -> list[str]:
    value = metadata.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModelLoadError(f"{source}: GGUF metadata {key} is missing or not a list of strings")
    return value


def tokenizer_json_from_gguf(metadata: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The tokenizer.json object that the GGUF tokenizer metadata stands for.

    Raises:
        ModelLoadError: not a byte-level BPE (``tokenizer.ggml.model`` other
            than ``gpt2``), an unsupported pre-tokenizer, or malformed lists.
    """
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelLoadError(f"{source}: GGUF tokenizer model {model!r} is not supported "
                             "(kestrel-trio serves byte-level BPE tokenizers, 'gpt2')")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ModelLoadError(f"{source}: GGUF pre-tokenizer {pre!r} is not supported "
                             f"(supported: {', '.join(PRE_TOKENIZERS)})")
    tokens = _strings(metadata, "tokenizer.ggml.tokens", source)
    merges = _strings(metadata, "tokenizer.ggml.merges", source)
    types = metadata.get("tokenizer.ggml.token_type")
    types = [TOKEN_NORMAL] * len(tokens) if types is None else [int(t) for t in types]
    if len(types) != len(tokens):
        raise ModelLoadError(f"{source}: GGUF has {len(tokens)} tokens but {len(types)} token types")
    vocab: dict[str, int] = {}
    added: list[dict[str, Any]] = []
    for token_id, (token, kind) in enumerate(zip(tokens, types)):
        if kind == TOKEN_UNUSED or token in vocab:  # the converter's [PADn] fillers; a repeat keeps its first id
            continue
        vocab[token] = token_id
        if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN):
            added.append({"id": token_id, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": kind != TOKEN_USER_DEFINED})
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ModelLoadError(f"{source}: GGUF merge {merge!r} is not two tokens separated by a space")
        pairs.append(parts)
    normalizer, pre_tokenizer, ignore_merges = PRE_TOKENIZERS[pre]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "post_processor": _BYTE_LEVEL, "decoder": _BYTE_LEVEL,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": pairs},
    }


def backend_from_gguf(metadata: Mapping[str, Any], source: str) -> tokenizers.Tokenizer:
    """The ``tokenizers.Tokenizer`` of a GGUF's tokenizer metadata (see :func:`tokenizer_json_from_gguf`)."""
    spec = tokenizer_json_from_gguf(metadata, source)
    try:
        return tokenizers.Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    except BaseException as exc:  # the Rust side raises plain Exception, or panics (pyo3's PanicException)
        if not (isinstance(exc, Exception) or type(exc).__name__ == "PanicException"):
            raise
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"{source}: the GGUF tokenizer cannot be built: {first}") from None


# Control tokens that end a turn in the families served; llama.cpp treats these as end-of-generation too.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


def special_tokens_from_gguf(metadata: Mapping[str, Any], source: str) -> tuple[dict[str, str], list[int]]:
    """The named special tokens (``bos_token`` ...) and the end-of-sequence ids of a GGUF's metadata.

    End-of-sequence: ``eos_token_id``, ``eot_token_id`` and ``eom_token_id``,
    and the control tokens of END_OF_TURN_TOKENS, as llama.cpp stops on them.
    """
    tokens: Sequence[str] = metadata.get("tokenizer.ggml.tokens") or []
    types = metadata.get("tokenizer.ggml.token_type")
    named: dict[str, str] = {}
    eos: list[int] = []
    for name in ("bos", "eos", "unknown", "padding", "eot", "eom"):
        value = metadata.get(f"tokenizer.ggml.{name}_token_id")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(tokens):
            raise ModelLoadError(f"{source}: GGUF metadata tokenizer.ggml.{name}_token_id {value!r} is not a token id")
        if name in ("eos", "eot", "eom"):
            eos.append(value)
        key = {"unknown": "unk_token", "padding": "pad_token"}.get(name, f"{name}_token")
        if key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            named[key] = tokens[value]
    if types is not None:
        eos += [i for i, (token, kind) in enumerate(zip(tokens, types))
                if int(kind) == TOKEN_CONTROL and token in END_OF_TURN_TOKENS]
    return named, sorted(set(eos))
