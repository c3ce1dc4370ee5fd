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
reads its matrices into arrays instead (kestrel_trio._model.weights.assemble).
"""

from __future__ import annotations

import mmap

import attrs
import numpy as np

__all__ = ["mapped_bytes", "is_mapped", "reachable"]


def mapped_bytes(obj: object) -> int:
    """Bytes of the distinct memory-mapped arrays reachable from ``obj`` (attrs classes, tuples, lists, arrays)."""
    spans = sorted((a.__array_interface__["data"][0], a.__array_interface__["data"][0] + a.nbytes)
                   for a in reachable(obj, np.ndarray) if a.size and is_mapped(a))
    total, reach = 0, 0
    for start, end in spans:  # overlapping views of one mapped tensor count once
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def reachable(obj: object, kind: type) -> list:
    """Each distinct ``kind`` object reachable from ``obj`` through tuples, lists and attrs classes' fields.

    A ``kind`` object found is not looked into (weights: every array, or every packed matrix, of a model).
    """
    found: dict[int, object] = {}
    seen: set[int] = set()
    pending = [obj]
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, kind):
            found[id(value)] = value
        elif isinstance(value, (tuple, list)):
            pending.extend(value)
        elif attrs.has(type(value)):
            pending.extend(getattr(value, field.name) for field in attrs.fields(type(value)))
    return list(found.values())


def is_mapped(array: np.ndarray) -> bool:
    """Whether ``array``'s memory is a view of a memory map."""
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)
