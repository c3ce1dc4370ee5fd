"""Which bytes of a model's weights are memory-mapped from the checkpoint file.

Mapped pages are page cache: the kernel counts them in MemAvailable as if it
could drop them, but the model reads every one of them at every step. A
memory budget computed from MemAvailable must take them off first.
"""

from __future__ import annotations

import mmap

import attrs
import numpy as np

__all__ = ["mapped_bytes"]


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
        if _is_mapped(obj) and obj.size:
            start = obj.__array_interface__["data"][0]
            spans.append((start, start + obj.nbytes))
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            _collect(item, spans, seen)
    elif attrs.has(type(obj)):
        for field in attrs.fields(type(obj)):
            _collect(getattr(obj, field.name), spans, seen)


def _is_mapped(array: np.ndarray) -> bool:
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)
