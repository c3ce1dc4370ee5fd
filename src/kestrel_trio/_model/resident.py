"""Which bytes of a model's weights are memory-mapped from the checkpoint file.

Mapped pages are page cache: the kernel counts them in MemAvailable as if it
could drop them, but the model reads every one of them at every step. A
memory budget computed from MemAvailable must take them off first.

Mappings keep the kernel's default pages. Asking for huge pages
(``MADV_HUGEPAGE``) would speed the dense matrices' streaming where the page
cache holds large folios, but a tensor read sparsely then maps 2 MiB for
each row or expert it touches: a Qwen3-MoE GGUF (128 MiB, 32 experts),
read from a cold page cache, measured 193 MiB of RSS after a 48-token
prompt and 16 new tokens without the advice and 228-231 MiB with it (the
2-core Xeon, kernel 6.18, ext4). The quantized forms are bound by their
expansion, not by the page walk, so they would gain little. fp32 residency
reads its matrices into arrays instead (kestrel_trio._model.weights).
"""

from __future__ import annotations

import mmap

import attrs
import numpy as np

__all__ = ["mapped_bytes", "is_mapped"]


def mapped_bytes(obj: object) -> int:
    """Bytes of the distinct memory-mapped arrays reachable from ``obj`` (attrs classes, tuples, lists, arrays)."""
    spans: list[tuple[int, int]] = []
    _collect(obj, spans, set())
    total, reach = 0, 0
    for start, end in sorted(spans):  # overlapping views of one mapped tensor count once
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _collect(obj: object, spans: list[tuple[int, int]], seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        if is_mapped(obj) and obj.size:
            start = obj.__array_interface__["data"][0]
            spans.append((start, start + obj.nbytes))
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            _collect(item, spans, seen)
    elif attrs.has(type(obj)):
        for field in attrs.fields(type(obj)):
            _collect(getattr(obj, field.name), spans, seen)


def is_mapped(array: np.ndarray) -> bool:
    """Whether ``array``'s memory is a view of a memory map."""
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)
