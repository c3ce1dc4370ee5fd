"""Tokenizer: the real Qwen3 tokenizer's facts, folder loading and the demo copy."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import tokenizers

from kestrel_trio.errors import ModelLoadError
from kestrel_trio.text import Tokenizer

IM_START, IM_END, ENDOFTEXT, THINK, END_THINK, TOOL_CALL = 151644, 151645, 151643, 151667, 151668, 151657


def test_qwen3_vocabulary_facts(qwen_tokenizer: Tokenizer) -> None:
    assert qwen_tokenizer.vocab_size == 151_669
    assert qwen_tokenizer.token_to_id("<|endoftext|>") == ENDOFTEXT
    assert qwen_tokenizer.token_to_id("<|im_start|>") == IM_START
    assert qwen_tokenizer.token_to_id("<|im_end|>") == IM_END
    assert qwen_tokenizer.token_to_id("<tool_call>") == TOOL_CALL
    assert qwen_tokenizer.token_to_id("</think>") == END_THINK
    assert qwen_tokenizer.id_to_token(THINK) == "<think>"
    assert qwen_tokenizer.id_to_token(151_700) is None
    assert qwen_tokenizer.token_to_id("no such token") is None


def test_special_ids_are_the_added_tokens_marked_special(qwen_tokenizer: Tokenizer) -> None:
    assert qwen_tokenizer.special_token_ids == frozenset(range(151643, 151657))
    assert THINK not in qwen_tokenizer.special_token_ids
    assert TOOL_CALL not in qwen_tokenizer.special_token_ids


def test_folder_without_generation_config_ends_on_im_end(qwen_tokenizer: Tokenizer, qwen_dir: Path) -> None:
    assert qwen_tokenizer.eos_token_ids == frozenset({IM_END})
    assert qwen_tokenizer.generation_defaults == {}
    assert qwen_tokenizer.special_tokens_map == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert qwen_tokenizer.chat_template == (qwen_dir / "chat_template.jinja").read_text(encoding="utf-8")


def test_encode_adds_no_bos_and_round_trips(qwen_tokenizer: Tokenizer) -> None:
    text = "Hello, 世界! 😀 naïve <think>"
    ids = qwen_tokenizer.encode(text)
    assert ids[0] != ENDOFTEXT
    assert ids[-1] == THINK  # added tokens are recognised inside text
    assert qwen_tokenizer.decode(ids) == text
    assert qwen_tokenizer.encode("Hello") == [9707]


def test_long_texts_encode_exactly_as_short_ones(qwen_tokenizer: Tokenizer) -> None:
    # Past a length the GIL-free batch call is used; the ids must not change with the path taken.
    piece = "Ünïcode 文字 <|im_start|>user\n  spaces\t\ttabs 1234567 😀 "
    text = piece * (5000 // len(piece) + 1)
    assert len(text) >= 4096
    backend = qwen_tokenizer._backend
    assert qwen_tokenizer.encode(text) == backend.encode(text, add_special_tokens=False).ids
    assert qwen_tokenizer.encode(text[:100]) == backend.encode(text[:100], add_special_tokens=False).ids


def test_very_long_texts_encode_in_pieces_cut_after_added_tokens_with_the_same_ids(qwen_tokenizer: Tokenizer) -> None:
    # Past two pieces' length the text is encoded piece by piece, each cut right after an added token.
    piece = "Ünïcode 文字 <|im_start|>user\n  spaces\t\ttabs<|im_end|>\n<think>x</think> 😀 "
    text = piece * (300_000 // len(piece) + 1)
    pieces = list(qwen_tokenizer._pieces(text))
    assert len(pieces) > 2 and "".join(pieces) == text
    assert all(any(p.endswith(t) for t in ("<|im_start|>", "<|im_end|>", "<think>", "</think>")) for p in pieces[:-1])
    whole = qwen_tokenizer._backend.encode(text, add_special_tokens=False).ids
    assert qwen_tokenizer.encode(text) == whole
    assert qwen_tokenizer.encode_bounded(text, len(whole)) == (whole, len(whole))
    ids, counted = qwen_tokenizer.encode_bounded(text, 1000)  # far too long: counted in a few pieces, no list
    assert ids is None and 1000 < counted < len(whole)
    plain = "abc def " * 40_000  # no added token to cut after: one piece
    assert list(qwen_tokenizer._pieces(plain)) == [plain]


def test_decode_skips_special_tokens_only_when_asked(qwen_tokenizer: Tokenizer) -> None:
    ids = [IM_START, *qwen_tokenizer.encode("hi"), THINK, IM_END]
    assert qwen_tokenizer.decode(ids) == "hi<think>"
    assert qwen_tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>hi<think><|im_end|>"


def test_token_bytes_splits_a_character_across_tokens(qwen_tokenizer: Tokenizer) -> None:
    ids = qwen_tokenizer.encode("😀")
    assert b"".join(qwen_tokenizer.token_bytes(i) for i in ids) == "😀".encode()
    assert qwen_tokenizer.token_bytes(IM_END) == b"<|im_end|>"
    assert qwen_tokenizer.token_bytes(151_700) is None
    # Every single-byte token maps back to its own byte value.
    single = {qwen_tokenizer.token_bytes(i) for i in range(256)}
    assert single == {bytes([b]) for b in range(256)}


@pytest.fixture
def checkpoint(tmp_path: Path, qwen_dir: Path) -> Path:
    """A checkpoint folder sharing the real tokenizer.json, with its own small files."""
    # A copy, not a symlink: a model folder's file linked out of it is refused (issue 49).
    shutil.copyfile(qwen_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((qwen_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = "from tokenizer_config"
    config["eos_token"] = {"content": "<|im_end|>", "special": True}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    generation = {
        "bos_token_id": 151643,
        "eos_token_id": [151645, 151643],
        "do_sample": True,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "pad_token_id": 151643,
    }
    (tmp_path / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
    return tmp_path


def test_from_folder_reads_all_files(checkpoint: Path) -> None:
    (checkpoint / "chat_template.jinja").write_text("from the jinja file", encoding="utf-8")
    tok = Tokenizer.from_folder(checkpoint)
    assert tok.eos_token_ids == frozenset({IM_END, ENDOFTEXT})
    assert tok.generation_defaults == {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    assert tok.chat_template == "from the jinja file"  # chat_template.jinja wins, as in transformers
    assert tok.encode("Hello") == [9707]


def _backend(qwen_tokenizer: Tokenizer) -> tokenizers.Tokenizer:
    return qwen_tokenizer._backend


def test_config_template_and_scalar_eos(qwen_tokenizer: Tokenizer) -> None:
    tok = Tokenizer(
        _backend(qwen_tokenizer),
        tokenizer_config={"chat_template": "from tokenizer_config", "eos_token": "<|im_end|>"},
        generation_config={"eos_token_id": 151643, "repetition_penalty": 1.1},
    )
    assert tok.chat_template == "from tokenizer_config"
    assert tok.eos_token_ids == frozenset({IM_END, ENDOFTEXT})
    assert tok.generation_defaults == {"repetition_penalty": 1.1}


def test_named_template_list_uses_default(qwen_tokenizer: Tokenizer) -> None:
    config = {"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "chat"}]}
    assert Tokenizer(_backend(qwen_tokenizer), tokenizer_config=config).chat_template == "chat"
    assert Tokenizer(_backend(qwen_tokenizer)).chat_template is None


def test_unknown_eos_token_is_a_load_error(qwen_tokenizer: Tokenizer) -> None:
    with pytest.raises(ModelLoadError, match="eos_token"):
        Tokenizer(_backend(qwen_tokenizer), tokenizer_config={"eos_token": "<|no such token|>"})
    with pytest.raises(ModelLoadError, match="generation_config.json"):
        Tokenizer(_backend(qwen_tokenizer), generation_config={"eos_token_id": "x"})


def test_missing_tokenizer_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer.from_folder(tmp_path)


@pytest.mark.parametrize("name", ["tokenizer_config.json", "generation_config.json"])
def test_malformed_json_names_the_file(checkpoint: Path, name: str) -> None:
    (checkpoint / name).write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelLoadError, match=name):
        Tokenizer.from_folder(checkpoint)


def test_non_byte_level_tokenizer_is_refused(tmp_path: Path) -> None:
    word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    word_level.decoder = tokenizers.decoders.WordPiece()
    word_level.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ModelLoadError, match="byte-level"):
        Tokenizer.from_folder(tmp_path)


def test_demo_loads_as_the_upstream_folder_does(qwen_tokenizer: Tokenizer, qwen_dir: Path) -> None:
    demo = Tokenizer.from_demo()
    text = "Qwen3 演示 🦅 tokenizer <|im_end|>"
    assert demo.encode(text) == qwen_tokenizer.encode(text)
    assert demo.vocab_size == qwen_tokenizer.vocab_size
    assert demo.eos_token_ids == frozenset({IM_END, 151643})  # <|im_end|> and <|endoftext|>
    assert demo.chat_template == (qwen_dir / "chat_template.jinja").read_text(encoding="utf-8")


def test_demo_notice_records_the_original_hashes(qwen_dir: Path) -> None:
    demo_dir = Path(__import__("kestrel_trio").__file__).parent / "_demo"
    notice = (demo_dir / "NOTICE").read_text(encoding="utf-8")
    assert "Apache" in notice and "Qwen/Qwen3-0.6B" in notice
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert hashlib.sha256((qwen_dir / name).read_bytes()).hexdigest() in notice
