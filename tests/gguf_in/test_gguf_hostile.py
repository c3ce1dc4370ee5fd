"""Hostile GGUF headers (issue 49 item 4): each is one ModelLoadError naming the file and the field, never a
wrapped size, a RecursionError or gigabytes of Python objects. The files are raw bytes written here."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kestrel_trio._model.gguf.reader import GgufFile
from kestrel_trio.errors import ModelLoadError


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf(kvs: list[bytes], tensors: list[bytes], data: bytes = b"") -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(tensors)
    return head + b"\0" * (-len(head) % 32) + data


def _tensor(name: str, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    return _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ggml_type, offset)


def _nested(depth: int) -> bytes:
    """A metadata value: an array holding an array ... ``depth`` deep, the innermost one empty of uint8."""
    value = struct.pack("<IQ", 0, 0)  # item type uint8, no items
    for _ in range(depth):
        value = struct.pack("<IQ", 9, 1) + value
    return value


def _load_error(tmp_path: Path, raw: bytes) -> str:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(raw)
    with pytest.raises(ModelLoadError) as info:
        GgufFile(path)
    message = str(info.value)
    assert message.startswith("hostile.gguf: ") and "\n" not in message
    return message


def test_a_tensor_whose_dims_overflow_int64_is_refused(tmp_path: Path) -> None:
    # 2^32 * 2^32 wraps to 0 in int64: 0 bytes would pass the end-of-file check
    message = _load_error(tmp_path, _gguf([], [_tensor("blk.0.w", [1 << 32, 1 << 32])]))
    assert "'blk.0.w'" in message


def test_metadata_nested_thousands_deep_is_refused(tmp_path: Path) -> None:
    kv = _str("general.deep") + struct.pack("<I", 9) + _nested(5000)
    message = _load_error(tmp_path, _gguf([kv], []))
    assert "'general.deep'" in message and "deep" in message


def test_millions_of_small_nested_arrays_are_refused(tmp_path: Path) -> None:
    count = 1 << 20  # each an empty uint8 array of 12 bytes: 12 MB of file, ~100 MB of Python objects unbounded
    kv = _str("general.many") + struct.pack("<IIQ", 9, 9, count) + struct.pack("<IQ", 0, 0) * count
    message = _load_error(tmp_path, _gguf([kv], []))
    assert "'general.many'" in message and "arrays" in message


def test_a_negative_looking_offset_is_refused(tmp_path: Path) -> None:
    message = _load_error(tmp_path, _gguf([], [_tensor("w", [32], 0, (1 << 64) - 32)]))
    assert "'w'" in message


def _valid() -> bytes:
    kvs = [_str("general.architecture") + struct.pack("<I", 8) + _str("llama"),
           _str("general.list") + struct.pack("<IIQ", 9, 4, 3) + struct.pack("<3I", 1, 2, 3),
           _str("general.names") + struct.pack("<IIQ", 9, 8, 2) + _str("a") + _str("bc")]
    return _gguf(kvs, [_tensor("w", [32, 2], 0, 0)], b"\1" * 256)


def test_the_fuzz_seed_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "seed.gguf"
    path.write_bytes(_valid())
    gguf = GgufFile(path)
    assert gguf.tensors["w"].shape == (2, 32) and gguf.metadata["general.names"] == ["a", "bc"]


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 400), st.binary(min_size=1, max_size=9)), min_size=1, max_size=6),
       cut=st.integers(0, 400))
def test_fuzz_mutated_headers_give_clean_errors(tmp_path: Path, edits: list[tuple[int, bytes]], cut: int) -> None:
    """Overwrites and truncations of a small valid file: it loads or it is one ModelLoadError, nothing else."""
    raw = bytearray(_valid())
    for at, patch in edits:
        at %= len(raw)
        raw[at : at + len(patch)] = patch
    if cut < len(raw) and cut % 3 == 0:
        raw = raw[:cut]
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(raw))
    try:
        GgufFile(path)
    except ModelLoadError as exc:
        assert str(exc).startswith("fuzz.gguf: ")


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=300))
def test_fuzz_random_bytes_after_the_magic_give_clean_errors(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "random.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<I", 3) + body)
    try:
        GgufFile(path)
    except ModelLoadError as exc:
        assert str(exc).startswith("random.gguf: ")
