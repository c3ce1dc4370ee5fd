"""A safetensors reader: one file or a sharded set, bf16 / fp16 / fp32 to float32.

Format: an 8-byte little-endian header length N, N bytes of JSON mapping each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets
relative to the end of the header), then the raw little-endian data.

Every header is checked against the file's size when the checkpoint is opened,
so a truncated file is reported by name before any tensor is read. fp32 tensors
are memory-mapped read-only (no copy; the page cache is shared by every process
that maps the file); bf16 and fp16 tensors are read with plain file reads and
upcast into fresh float32 arrays, so peak memory stays near the fp32 total.
``read_into`` fills a caller's buffer (a slice of a fused matrix) by plain file
reads, and ``read_bf16`` hands bf16 storage back as mapped bits, uncopied.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import attrs
import numpy as np

from kestrel_trio._model.checkpoints.confine import confined
from kestrel_trio.errors import ModelLoadError

__all__ = ["TensorInfo", "SafetensorsCheckpoint", "bf16_to_fp32", "fp32_to_bf16_bits"]

_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}
_MAX_HEADER_BYTES = 100 * 1024 * 1024
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@attrs.frozen
class TensorInfo:
    """Where one tensor lives: file, storage dtype, shape and absolute byte offset."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the file
    nbytes: int


def bf16_to_fp32(raw: np.ndarray) -> np.ndarray:
    """Upcast bf16 bits (uint16) to float32 exactly: bf16 is the top half of an fp32."""
    wide = raw.astype(np.uint32)  # [n] a fresh buffer that becomes the result
    wide <<= 16
    return wide.view(np.float32)


class SafetensorsCheckpoint:
    """The tensors of a checkpoint folder, by name.

    Args:
        folder: the checkpoint folder; it holds model.safetensors, or shards
            listed by model.safetensors.index.json.

    Raises:
        ModelLoadError: no weights, an unreadable or truncated file, a bad
            header, an unsupported dtype, or an index naming a missing file or
            tensor.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.tensors: dict[str, TensorInfo] = {}
        self._maps: dict[Path, mmap.mmap] = {}
        self._index_map: dict[str, Path] = {}
        for path in self._weight_files():
            for info in _read_header(path):
                if info.name in self.tensors:
                    raise ModelLoadError(f"{path.name}: tensor {info.name!r} also appears in {self.tensors[info.name].path.name}")
                self.tensors[info.name] = info
        self._check_index()

    def _weight_files(self) -> list[Path]:
        index = confined(self.folder, INDEX_NAME)
        if index.exists():
            return self._files_from_index(index)
        single = confined(self.folder, SINGLE_NAME)
        if single.exists():
            return [single]
        found = [confined(self.folder, path.name) for path in sorted(self.folder.glob("*.safetensors"))]
        if not found:
            raise ModelLoadError(f"{self.folder}: no model.safetensors or {INDEX_NAME} in the checkpoint folder")
        return found

    def _files_from_index(self, index: Path) -> list[Path]:
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({exc})") from None
        for name in files:
            confined(self.folder, name, named_by=index.name)
        paths = [self.folder / name for name in files]
        for path in paths:
            if not path.is_file():
                raise ModelLoadError(f"{index.name} names shard {path.name!r}, which is not in {self.folder}")
        self._index_map = {name: self.folder / file for name, file in weight_map.items()}
        return paths

    def _check_index(self) -> None:
        # Every tensor the index lists must be in the shard it names.
        for name, path in self._index_map.items():
            info = self.tensors.get(name)
            if info is None or info.path != path:
                raise ModelLoadError(f"{INDEX_NAME} places tensor {name!r} in {path.name}, which does not hold it")

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a read-only float32 array (memory-mapped for fp32 storage)."""
        info = self.tensors[name]
        if info.dtype == "F32":
            array = np.frombuffer(self._map(info.path), dtype="<f4", count=info.nbytes // 4, offset=info.offset)
            return array.reshape(info.shape)
        with open(info.path, "rb") as file:
            file.seek(info.offset)
            raw = np.empty(info.nbytes // 2, dtype=np.uint16)  # [n] storage bits
            if file.readinto(memoryview(raw).cast("B")) != info.nbytes:
                raise ModelLoadError(f"{info.path.name}: tensor {name!r} is truncated")
        if info.dtype == "BF16":
            out = bf16_to_fp32(raw)
        else:
            out = raw.view("<f2").astype(np.float32)
        out = out.reshape(info.shape)
        out.flags.writeable = False
        return out

    def read_bf16(self, name: str) -> np.ndarray:
        """Tensor ``name`` as read-only bf16 bits (uint16, its shape).

        bf16 storage is memory-mapped (no copy: the pages are the shared page
        cache); F32 and F16 storage is rounded to bf16 (nearest even) into a
        fresh array, since it cannot be mapped as bf16.
        """
        info = self.tensors[name]
        if info.dtype == "BF16":
            array = np.frombuffer(self._map(info.path), dtype="<u2", count=info.nbytes // 2, offset=info.offset)
            return array.reshape(info.shape)
        bits = fp32_to_bf16_bits(self.read(name)).reshape(info.shape)
        bits.flags.writeable = False
        return bits

    def read_into(self, name: str, out: np.ndarray) -> None:
        """Fill ``out`` (float32, C-contiguous, the tensor's size) with tensor ``name``.

        Plain file reads, never the memory map: a tensor copied into a fused
        matrix at load would otherwise stay resident twice (mapped and copied).
        """
        info = self.tensors[name]
        wanted = info.nbytes // _ITEMSIZE[info.dtype]
        if out.dtype != np.float32 or not out.flags.c_contiguous or out.size != wanted:
            raise ValueError(f"read_into({name!r}): destination must be contiguous float32 of {info.shape}")
        if info.dtype == "F32":
            _read_exact(info, memoryview(out.reshape(-1)).cast("B"))
            return
        raw = np.empty(out.size, dtype=np.uint16)  # [n] storage bits
        _read_exact(info, memoryview(raw).cast("B"))
        flat = out.reshape(-1)  # [n]
        if info.dtype == "BF16":
            wide = flat.view(np.uint32)  # [n] the destination's bits
            np.copyto(wide, raw, casting="unsafe")
            wide <<= 16
        else:
            np.copyto(flat, raw.view("<f2"), casting="unsafe")

    def _map(self, path: Path) -> mmap.mmap:
        if path not in self._maps:
            with open(path, "rb") as file:
                self._maps[path] = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        return self._maps[path]


def _read_exact(info: TensorInfo, buffer: memoryview) -> None:
    with open(info.path, "rb") as file:
        file.seek(info.offset)
        if file.readinto(buffer) != info.nbytes:
            raise ModelLoadError(f"{info.path.name}: tensor {info.name!r} is truncated")


def _read_header(path: Path) -> list[TensorInfo]:
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as file:
            prefix = file.read(8)
            if len(prefix) < 8:
                raise ModelLoadError(f"{path.name}: truncated safetensors file ({size} bytes, no header)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > _MAX_HEADER_BYTES or 8 + header_len > size:
                raise ModelLoadError(f"{path.name}: truncated or corrupt safetensors header (claims {header_len} bytes)")
            header = json.loads(file.read(header_len))
    except OSError as exc:
        raise ModelLoadError(f"{path.name}: cannot read: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path.name}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path.name}: safetensors header is not a JSON object")
    data_start = 8 + header_len
    infos = [_tensor_info(path, name, entry, data_start, size) for name, entry in header.items() if name != "__metadata__"]
    return infos


def _tensor_info(path: Path, name: str, entry: object, data_start: int, file_size: int) -> TensorInfo:
    try:
        dtype = entry["dtype"]  # type: ignore[index]
        shape = tuple(int(d) for d in entry["shape"])  # type: ignore[index]
        begin, end = (int(x) for x in entry["data_offsets"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError) as exc:
        raise ModelLoadError(f"{path.name}: tensor {name!r} has a malformed header entry ({exc})") from None
    if dtype not in _ITEMSIZE:
        raise ModelLoadError(f"{path.name}: tensor {name!r} has dtype {dtype}; only F32, F16 and BF16 are supported")
    expected = int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[dtype]
    if end - begin != expected or begin < 0:
        raise ModelLoadError(f"{path.name}: tensor {name!r} spans {end - begin} bytes but shape {list(shape)} {dtype} needs {expected}")
    if data_start + end > file_size:
        raise ModelLoadError(
            f"{path.name}: file is truncated: tensor {name!r} ends at byte {data_start + end} but the file has {file_size}"
        )
    return TensorInfo(name=name, path=path, dtype=dtype, shape=shape, offset=data_start + begin, nbytes=expected)


def fp32_to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest even), returned as uint16 bits."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)  # [n]
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def save_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    """Write ``tensors`` to one safetensors file, stored as ``dtype`` (F32, F16 or BF16).

    Tensors are written in the order given, 8-byte aligned like the reference writer.
    """
    if dtype not in _ITEMSIZE:
        raise ValueError(f"dtype must be one of {sorted(_ITEMSIZE)}")
    blobs: list[bytes] = []
    header: dict[str, object] = {}
    offset = 0
    for name, array in tensors.items():
        array = np.asarray(array, dtype=np.float32)
        if dtype == "BF16":
            data = fp32_to_bf16_bits(array).tobytes()
        else:
            data = array.astype("<f2" if dtype == "F16" else "<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for blob in blobs:
            file.write(blob)
