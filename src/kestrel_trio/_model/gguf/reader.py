"""A reader of GGUF files (llama.cpp's single-file format): header, metadata and tensor table.

Format (version 2 and 3, little-endian): the magic ``GGUF``, a uint32
version, uint64 tensor and key/value counts; then the key/value pairs (a
string key, a uint32 value type, the value; strings are a uint64 byte length
and UTF-8 bytes; arrays a uint32 item type, a uint64 count and the items);
then one entry per tensor (name, uint32 dimension count, uint64 dimensions
innermost first, uint32 ggml type, uint64 offset); then, at the next multiple
of ``general.alignment`` (32 by default), the tensor data, each tensor at its
offset from there.

The whole table is read and checked against the file's size when the file is
opened: a truncated file, a wrong magic or version, an unknown tensor type or
a tensor reaching past the end is one :class:`ModelLoadError` naming the file
and what is wrong, before any tensor data is touched. The data itself is
memory-mapped read-only; :meth:`GgufFile.raw_rows` hands out uint8 views of a
tensor's rows, never a copy.

This is an in-house reader rather than the ``gguf`` package (llama.cpp's own
Python reader) so that the model core stays numpy-only and a malformed file
gets a kestrel error naming the problem rather than an assertion.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from kestrel_trio._model.forms.dequant import GGML_TYPES, GgmlType
from kestrel_trio.errors import ModelLoadError

__all__ = ["GGUF_MAGIC", "SUPPORTED_VERSIONS", "GgufTensor", "GgufFile", "is_gguf_file"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # the same layout; version 1 had 32-bit counts
DEFAULT_ALIGNMENT = 32
# Guards against a corrupt count asking for gigabytes of Python objects.
_MAX_ITEMS = 1 << 28
# Metadata budgets: nested arrays deeper than this are refused before Python's recursion limit is near; the whole
# metadata may hold at most this many values (every nested array and item counts) and this many bytes. The largest
# real files (a 256k-token vocabulary with its scores, types and merges) stay well under both.
_MAX_NESTING = 8
_MAX_METADATA_VALUES = 1 << 22
_MAX_METADATA_ARRAYS = 1 << 16  # each array is a Python object of ~100 bytes; real files have a few dozen
_MAX_METADATA_BYTES = 1 << 30
# A tensor holds at most 2^48 elements (256 Ti): a product past that is refused rather than wrapping in int64.
_MAX_ELEMENTS = 1 << 48

# Value types: (struct format, size) for the scalars, by type id.
_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_NUMPY_OF = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
             12: "<f8"}
_STRING, _ARRAY = 8, 9


@attrs.frozen
class GgufTensor:
    """One tensor of a GGUF file.

    Attributes:
        name: the GGUF name (``blk.0.attn_q.weight``).
        ggml_type: its storage type.
        shape: numpy order, outermost first (GGUF stores dimensions innermost first).
        offset: absolute byte offset of its data in the file.
        nbytes: bytes of data.
    """

    name: str
    ggml_type: GgmlType
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def rows(self) -> int:
        """Rows of ``shape[-1]`` elements: the product of the outer dimensions."""
        return int(np.prod(self.shape[:-1], dtype=np.int64))

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (whole blocks)."""
        return self.shape[-1] // self.ggml_type.block_size * self.ggml_type.type_size


def is_gguf_file(path: str | Path) -> bool:
    """Whether ``path`` is a regular file that starts with the GGUF magic."""
    try:
        with open(path, "rb") as file:
            return Path(path).is_file() and file.read(4) == GGUF_MAGIC
    except OSError:
        return False


class GgufFile:
    """The metadata and tensor table of a GGUF file, its data memory-mapped.

    Args:
        path: the .gguf file.

    Attributes:
        path: the file.
        version: the format version.
        metadata: every key/value pair; arrays of numbers are numpy arrays,
            arrays of strings lists of str.
        tensors: by GGUF name, in file order.

    Raises:
        ModelLoadError: the file is unreadable, truncated, not GGUF, of an
            unsupported version, or holds an unknown tensor type or a tensor
            outside the file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                if size == 0:
                    raise ModelLoadError(f"{self.path.name}: empty file, not a GGUF model")
                self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise ModelLoadError(f"{self.path.name}: cannot read: {exc}") from None
        self.size = size
        cursor = _Cursor(self._map, self.path.name)
        self.version, tensor_count, kv_count = _read_preamble(cursor)
        self.metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string()
            if key in self.metadata:
                raise ModelLoadError(f"{self.path.name}: metadata key {key!r} appears twice")
            self.metadata[key] = cursor.value(cursor.u32(), key)
        infos = [_read_tensor_info(cursor) for _ in range(tensor_count)]
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
            raise ModelLoadError(f"{self.path.name}: general.alignment must be a power of two, got {alignment!r}")
        data_start = -(-cursor.position // alignment) * alignment
        self.tensors: dict[str, GgufTensor] = {}
        for name, shape, type_id, offset in infos:
            if name in self.tensors:
                raise ModelLoadError(f"{self.path.name}: tensor {name!r} appears twice")
            self.tensors[name] = self._tensor(name, shape, type_id, data_start + offset)

    def _tensor(self, name: str, dims: tuple[int, ...], type_id: int, offset: int) -> GgufTensor:
        ggml_type = GGML_TYPES.get(type_id)
        if ggml_type is None:
            raise ModelLoadError(f"{self.path.name}: tensor {name!r} has ggml type {type_id}, which kestrel-trio "
                                 f"cannot read (supported: {', '.join(t.name for t in GGML_TYPES.values())})")
        shape = tuple(reversed(dims))  # numpy order: outermost first
        if not shape or min(shape) < 1:
            raise ModelLoadError(f"{self.path.name}: tensor {name!r} has dimensions {list(dims)}")
        if shape[-1] % ggml_type.block_size:
            raise ModelLoadError(f"{self.path.name}: tensor {name!r} ({ggml_type.name}) has rows of {shape[-1]} "
                                 f"elements, not a multiple of its block size {ggml_type.block_size}")
        elements = 1
        for dim in shape:  # Python ints: a product that would overflow int64 is refused, never wrapped
            elements *= dim
            if elements > _MAX_ELEMENTS:
                raise ModelLoadError(f"{self.path.name}: tensor {name!r} has dimensions {list(dims)}, more than "
                                     f"{_MAX_ELEMENTS} elements")
        nbytes = elements // ggml_type.block_size * ggml_type.type_size
        if offset < 0 or offset + nbytes > self.size:
            raise ModelLoadError(f"{self.path.name}: file is truncated: tensor {name!r} ends at byte "
                                 f"{offset + nbytes} but the file has {self.size}")
        return GgufTensor(name=name, ggml_type=ggml_type, shape=shape, offset=offset, nbytes=nbytes)

    def raw_rows(self, name: str) -> np.ndarray:
        """Tensor ``name``'s data as read-only uint8 [rows, row_bytes], a view of the mapped file."""
        t = self.tensors[name]
        data = np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset)  # [nbytes]
        return data.reshape(t.rows, t.row_bytes)  # [rows, row_bytes]

    def string(self, key: str) -> str | None:
        """Metadata ``key`` when it is a string, else None."""
        value = self.metadata.get(key)
        return value if isinstance(value, str) else None


def _read_preamble(cursor: "_Cursor") -> tuple[int, int, int]:
    magic = cursor.take(4, "the magic")
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{cursor.file}: not a GGUF file (starts with {bytes(magic)!r}, not {GGUF_MAGIC!r})")
    version = cursor.u32()
    if version not in SUPPORTED_VERSIONS:
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        hint = " (a big-endian file, which is not supported)" if swapped in SUPPORTED_VERSIONS else ""
        raise ModelLoadError(f"{cursor.file}: GGUF version {version}{hint} is not supported "
                             f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))})")
    tensor_count, kv_count = cursor.u64(), cursor.u64()
    if tensor_count > _MAX_ITEMS or kv_count > _MAX_ITEMS:
        raise ModelLoadError(f"{cursor.file}: corrupt GGUF header ({tensor_count} tensors, {kv_count} keys)")
    return version, tensor_count, kv_count


def _read_tensor_info(cursor: "_Cursor") -> tuple[str, tuple[int, ...], int, int]:
    name = cursor.string()
    n_dims = cursor.u32()
    if n_dims > 8:
        raise ModelLoadError(f"{cursor.file}: tensor {name!r} claims {n_dims} dimensions")
    dims = tuple(cursor.u64() for _ in range(n_dims))
    return name, dims, cursor.u32(), cursor.u64()


class _Cursor:
    """Sequential little-endian reads from the mapped header, each checked against the file's end."""

    def __init__(self, data: mmap.mmap, file: str) -> None:
        self.data = data
        self.file = file
        self.position = 0
        self.values = 0  # metadata values read so far, against _MAX_METADATA_VALUES
        self.arrays = 0  # metadata arrays read so far, against _MAX_METADATA_ARRAYS

    def take(self, n: int, what: str = "the header") -> memoryview:
        end = self.position + n
        if end > len(self.data):
            raise ModelLoadError(f"{self.file}: truncated GGUF file: {what} needs bytes up to {end}, "
                                 f"the file has {len(self.data)}")
        view = memoryview(self.data)[self.position : end]
        self.position = end
        return view

    def scalar(self, type_id: int) -> Any:
        fmt, size = _SCALARS[type_id]
        return struct.unpack(fmt, self.take(size))[0]

    def u32(self) -> int:
        return self.scalar(4)

    def u64(self) -> int:
        return self.scalar(10)

    def string(self) -> str:
        length = self.u64()
        raw = self.take(length, "a string")
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise ModelLoadError(f"{self.file}: a metadata string at byte {self.position - length} "
                                 f"is not UTF-8") from None

    def value(self, type_id: int, key: str, depth: int = 0) -> Any:
        self.values += 1
        if self.values > _MAX_METADATA_VALUES or self.position > _MAX_METADATA_BYTES:
            raise ModelLoadError(f"{self.file}: metadata {key!r}: the metadata holds more than "
                                 f"{_MAX_METADATA_VALUES} values or {_MAX_METADATA_BYTES} bytes")
        if type_id in _SCALARS:
            return self.scalar(type_id)
        if type_id == _STRING:
            return self.string()
        if type_id != _ARRAY:
            raise ModelLoadError(f"{self.file}: metadata {key!r} has unknown value type {type_id}")
        self.arrays += 1
        if self.arrays > _MAX_METADATA_ARRAYS:
            raise ModelLoadError(f"{self.file}: metadata {key!r}: the metadata holds more than "
                                 f"{_MAX_METADATA_ARRAYS} arrays")
        item_type, count = self.u32(), self.u64()
        if count > _MAX_ITEMS:
            raise ModelLoadError(f"{self.file}: metadata {key!r} claims {count} items")
        if depth >= _MAX_NESTING and item_type == _ARRAY:
            raise ModelLoadError(f"{self.file}: metadata {key!r} nests arrays more than {_MAX_NESTING} deep")
        if item_type in _NUMPY_OF:
            dtype = np.dtype(_NUMPY_OF[item_type])
            items = np.frombuffer(self.take(count * dtype.itemsize, f"metadata {key!r}"), dtype=dtype).copy()  # [count]
            return items.astype(bool) if item_type == 7 else items
        if item_type == _STRING:
            self.values += count
            return [self.string() for _ in range(count)]
        if item_type == _ARRAY:
            return [self.value(_ARRAY, key, depth + 1) for _ in range(count)]
        raise ModelLoadError(f"{self.file}: metadata {key!r} is an array of unknown type {item_type}")
