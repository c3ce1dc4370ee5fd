"""Checkpoint mappings ask for huge pages (kestrel_trio._model.resident): a decode step streams every weight."""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pytest

from kestrel_trio._model.resident import map_read_only

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE")
    or not os.path.isdir("/sys/kernel/mm/transparent_hugepage"),
    reason="needs Linux with transparent huge pages (MADV_HUGEPAGE, /proc/self/smaps)")


def _vm_flags(mapped: mmap.mmap) -> list[str]:
    """The VmFlags of the memory area holding ``mapped``, from /proc/self/smaps."""
    start = np.frombuffer(mapped, dtype=np.uint8).ctypes.data
    area = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                low, high = (int(v, 16) for v in head.split("-"))
                area = low <= start < high
            elif area and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError("the mapping is not in /proc/self/smaps")


def test_a_checkpoint_mapping_is_advised_to_use_huge_pages(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 4096)
    with open(path, "rb") as file:
        mapped = map_read_only(file)
    try:
        assert mapped[:3] == b"\x00\x01\x02" and len(mapped) == 256 * 4096
        assert "hg" in _vm_flags(mapped)  # VM_HUGEPAGE: madvise(MADV_HUGEPAGE) took
    finally:
        mapped.close()


def test_a_plain_mapping_has_no_such_advice(tmp_path):
    """The check above can fail: a mapping made without the advice shows no "hg"."""
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(4096 * 16))
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        assert "hg" not in _vm_flags(mapped)
    finally:
        mapped.close()
