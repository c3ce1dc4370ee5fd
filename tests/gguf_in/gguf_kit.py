"""What the GGUF tests share: the texts every tokenizer must encode as its original does, random valid blocks,
a rewriter of GGUF files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import tokenizers

from kestrel_trio._model.forms.dequant import GGML_TYPE_BY_NAME
from kestrel_trio.text import Tokenizer

__all__ = ["TEXTS", "assert_same_ids", "random_rows", "finite_fp16_bits", "rewrite_gguf"]

TEXTS = [
    "Hello, world! How are you today?",
    "Digits: 7 42 123 4567 89012 3.14159 1,000,000 and 2024-06-01",
    "中文测试：你好，世界！今天天气很好。日本語のテキストも。한국어도",
    "Emoji 🙂😀🎉 🚀🦙🦙 ❤️ 👍🏽 family: 👨‍👩‍👧‍👦 flags 🇫🇷",
    "whitespace runs:  two   three    four\t\ttabs\n\n\nnewlines \r\n crlf   \n  trailing   ",
    "def add(a, b):\n    return a + b  # sum\n\nif __name__ == '__main__':\n    print(add(1, 22))\n",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like tea? We'Ve a'lL",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYes.<|im_end|>",
    "Ünïcödé ñ façade naïve — “quotes” … ﬁ ligature, combining é, ＦＵＬＬ ｗｉｄｔｈ",
    "------======= ''''''```````\"\"\"\"......!!!!!!??????",
    "",
]


def assert_same_ids(ours: Tokenizer, original: tokenizers.Tokenizer) -> None:
    """``ours`` encodes every text of TEXTS to the ids ``original`` gives, and decodes them back alike."""
    for text in TEXTS:
        want = original.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == want, text
        assert ours.decode(want, skip_special_tokens=False) == original.decode(want, skip_special_tokens=False)


# Byte offsets of each type's fp16 scale fields within a block.
FP16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
               "Q5_K": (0, 2), "Q6_K": (208,)}


def finite_fp16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random fp16 bit patterns over the whole finite range (subnormals, zeros, signs), uint16 [n]."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    infinite = (bits & 0x7C00) == 0x7C00
    bits[infinite] &= np.uint16(0xFBFF)  # clear an exponent bit: finite, same sign
    return bits


def random_rows(name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random valid storage for ``rows`` x ``cols`` weights of type ``name``, uint8 [rows, row_bytes]."""
    rng = np.random.default_rng(seed)
    t = GGML_TYPE_BY_NAME[name]
    blocks = rng.integers(0, 256, size=(rows * cols // t.block_size, t.type_size), dtype=np.uint8)
    if name == "F32":
        scale = np.float32(10.0 ** rng.integers(-30, 30))
        values = (rng.standard_normal(blocks.shape[0], dtype=np.float32) * scale).astype(np.float32)
        blocks = values.view(np.uint8).reshape(blocks.shape)
    elif name in ("F16", "BF16"):
        bits = finite_fp16_bits(rng, blocks.shape[0])
        if name == "BF16":
            bits = rng.integers(0, 1 << 16, size=blocks.shape[0], dtype=np.uint16)
            bits[(bits & 0x7F80) == 0x7F80] &= np.uint16(0xFF7F)
        blocks = bits.view(np.uint8).reshape(blocks.shape)
    for start in FP16_FIELDS.get(name, ()):
        blocks[:, start : start + 2] = finite_fp16_bits(rng, blocks.shape[0]).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def rewrite_gguf(source: Path, out: Path, *, metadata: dict[str, Any] | None = None, drop: tuple[str, ...] = (),
                 tensors: dict[str, np.ndarray] | None = None,
                 transform: Callable[[Any], np.ndarray | None] | None = None) -> Path:
    """``source`` copied to ``out`` through gguf's reader and writer, changed as asked.

    Args:
        source: a GGUF file.
        out: where the copy goes.
        metadata: keys to change or add; None as a value drops the key.
        drop: tensors left out.
        tensors: tensors added, by name.
        transform: given each kept gguf ReaderTensor, the array written instead of its blocks, or None to
            copy them as they are.

    Returns:
        ``out``.
    """
    import gguf  # optional: the tests that call this skip without it

    reader = gguf.GGUFReader(source)
    metadata = dict(metadata or {})
    writer = gguf.GGUFWriter(out, metadata.get("general.architecture", reader.fields["general.architecture"].contents()))
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        value = metadata.pop(key, field.contents())
        if value is not None:
            writer.add_key_value(key, value, field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for key, value in metadata.items():
        if value is not None and key != "general.architecture":
            writer.add_key_value(key, value, gguf.GGUFValueType.get_type(value))
    for tensor in reader.tensors:
        if tensor.name in drop:
            continue
        replaced = None if transform is None else transform(tensor)
        if replaced is None:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
        else:
            writer.add_tensor(tensor.name, replaced)
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
