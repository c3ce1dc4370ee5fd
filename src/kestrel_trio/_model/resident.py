"""Mapping checkpoint files, and which bytes of a model's weights are memory-mapped from them.

Mapped pages are page cache: the kernel counts them in MemAvailable as if it
could drop them, but the model reads every one of them at every step. A
memory budget computed from MemAvailable must take them off first.

Page size decides how fast a step reads them. A decode step streams every
weight once, and with 4 KiB pages each page is a TLB miss and a stop for
the hardware prefetcher. Measured on the 2-core Xeon (kernel 6.18, ext4), a
2.2 GiB float32 gemv on 2 threads: 22 GB/s over a mapping of 4 KiB pages,
30 GB/s over one of 2 MiB pages, 32 GB/s over an anonymous copy (numpy
asks for transparent huge pages for large arrays). So mappings are made
with ``MADV_HUGEPAGE`` before anything reads them: where the filesystem
keeps large folios (ext4, xfs on recent kernels), pages read in through
the mapping come in 2 MiB at a time. Pages already in the page cache stay
as they were read.
"""

from __future__ import annotations

import mmap

import attrs
import numpy as np

__all__ = ["mapped_bytes", "map_read_only", "is_mapped"]


def map_read_only(file) -> mmap.mmap:
    """A read-only memory map of the whole of the open ``file``, advised to use huge pages (see above)."""
    mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
    if advice is not None:
        try:
            mapped.madvise(advice)
        except OSError:  # a kernel without transparent huge pages: 4 KiB pages, slower but correct
            pass
    return mapped


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
