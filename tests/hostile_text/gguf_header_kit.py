"""A GGUF header written byte by byte: a small valid config in its metadata, any key changed (issue 49 tests).

No ``gguf`` package needed; no tensors, so only the config path (``config_from_gguf``) reads it.
"""

from __future__ import annotations

import struct


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, value: object) -> bytes:
    if isinstance(value, str):
        return _str(key) + struct.pack("<I", 8) + _str(value)
    if isinstance(value, float):
        return _str(key) + struct.pack("<If", 6, value)
    return _str(key) + struct.pack("<IQ", 10, value)  # uint64


def gguf_bytes(arch: str = "llama", **changes: object) -> bytes:
    """A GGUF header with a small, valid ``arch`` config in its metadata and no tensors; ``changes`` by key
    suffix (``block_count=...``; None drops the key)."""
    keys: dict[str, object] = {"embedding_length": 16, "attention.head_count": 4, "block_count": 2,
                               "context_length": 64, "attention.layer_norm_rms_epsilon": 1e-6, "vocab_size": 32,
                               "feed_forward_length": 24}
    if arch == "qwen3moe":
        keys.update({"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 8,
                     "attention.key_length": 8})
    keys.update({k.replace("__", "."): v for k, v in changes.items()})
    kvs = [_kv("general.architecture", arch)] + [_kv(f"{arch}.{k}", v) for k, v in keys.items() if v is not None]
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    return head + b"\0" * (-len(head) % 32)
