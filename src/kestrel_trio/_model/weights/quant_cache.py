"""An on-disk cache of quantized weights: quantize once, memory-map on every later load.

``weights="int8"`` / ``"int4"`` quantize a float checkpoint at load, which
takes seconds to minutes; the arrays are then written to one file in the
cache folder (default ``~/.cache/kestrel-trio/quantized``, or
``$XDG_CACHE_HOME/kestrel-trio/quantized``) and every later load of the same
checkpoint in the same form maps that file instead: no quantizing, no copy,
pages shared between processes.

The file's name carries a key: a hash of the form, the format version, the
int4 group size and each checkpoint file's resolved path, size and
modification time (hashing gigabytes of weights would cost what the cache
saves). A checkpoint rewritten in place gets a new key; a stale file is never
read, only left behind.

Layout: the magic ``KTQW``, a uint64 header length, a JSON header (the key
and, per array, its dtype, shape and byte offset from the start of the data),
padding to ALIGN bytes, then the arrays, each ALIGN-aligned. Written to a
temporary name and renamed into place, so a reader never sees half a file; a
file that does not parse, or whose arrays do not fit it, is ignored (and
rewritten) with a logged warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["FORMAT_VERSION", "default_cache_dir", "cache_path", "write_arrays", "read_arrays"]

FORMAT_VERSION = 1
MAGIC = b"KTQW"
ALIGN = 64
_DTYPES = {"int8": np.int8, "uint8": np.uint8, "float16": np.float16, "float32": np.float32}


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/kestrel-trio/quantized``, else ``~/.cache/kestrel-trio/quantized``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kestrel-trio" / "quantized"


def cache_path(directory: Path, folder: Path, files: list[Path], form: str, scheme: dict) -> Path:
    """Where the cache file of checkpoint ``folder`` (weight ``files``) in ``form`` lives.

    Args:
        directory: the cache folder.
        folder: the checkpoint folder (its name starts the file name).
        files: the checkpoint's weight files; their paths, sizes and mtimes are the key.
        form: "int8" or "int4".
        scheme: anything else the arrays depend on (e.g. the int4 group size).
    """
    stats = []
    for file in sorted(Path(f).resolve() for f in files):
        info = file.stat()
        stats.append([str(file), info.st_size, info.st_mtime_ns])
    material = json.dumps([FORMAT_VERSION, form, scheme, stats], sort_keys=True).encode()
    digest = hashlib.sha256(material).hexdigest()[:24]
    return Path(directory) / f"{Path(folder).resolve().name}-{form}-{digest}.kq"


def write_arrays(path: Path, arrays: dict[str, np.ndarray], key: str) -> int:
    """Write ``arrays`` to ``path`` (atomically: a temporary file renamed into place); the bytes written."""
    entries, offset = {}, 0
    for name, array in arrays.items():
        offset = -(-offset // ALIGN) * ALIGN
        entries[name] = {"dtype": array.dtype.name, "shape": list(array.shape), "offset": offset}
        offset += array.nbytes
    header = json.dumps({"format": FORMAT_VERSION, "key": key, "arrays": entries}).encode()
    data_start = -(-(len(MAGIC) + 8 + len(header)) // ALIGN) * ALIGN
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as file:
            file.write(MAGIC + struct.pack("<Q", len(header)) + header)
            for name, array in arrays.items():
                file.seek(data_start + entries[name]["offset"])
                file.write(np.ascontiguousarray(array).data)
            file.truncate(data_start + offset)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return data_start + offset


def read_arrays(path: Path, key: str) -> dict[str, np.ndarray] | None:
    """The arrays of cache file ``path``, read-only views of its memory map; None if it is unusable (logged)."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        log.warning("%s: cannot map the quantized cache file (%s): quantizing again", path, exc)
        return None
    try:
        if mapped[:4] != MAGIC:
            raise ValueError("not a kestrel-trio quantized cache file")
        (length,) = struct.unpack("<Q", mapped[4:12])
        header = json.loads(mapped[12 : 12 + length])
        if header.get("format") != FORMAT_VERSION or header.get("key") != key:
            raise ValueError("written for another checkpoint or format")
        data_start = -(-(12 + length) // ALIGN) * ALIGN
        arrays = {}
        for name, entry in header["arrays"].items():
            dtype = np.dtype(_DTYPES[entry["dtype"]])
            count = int(np.prod(entry["shape"], dtype=np.int64))
            start = data_start + int(entry["offset"])
            if start + count * dtype.itemsize > size:
                raise ValueError(f"array {name!r} reaches past the end of the file")
            arrays[name] = np.frombuffer(mapped, dtype=dtype, count=count, offset=start).reshape(entry["shape"])
        return arrays
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        log.warning("%s: unusable quantized cache file (%s): quantizing again", path, exc)
        return None
