"""This process's memory: how much it may still take, how much it holds, and giving freed memory back.

:func:`read_host_memory` is read once, at engine start (after the weights are
loaded), to derive the default KV budget. Each source may be missing (not
Linux, no cgroup limit, no rlimit); the smallest of those present wins, and
:class:`HostMemory` says which, so the log line and /health can show where the
budget came from.

:func:`process_memory` is what /health shows of the process as a whole (its
resident set now and at its peak). :func:`release_free_memory` hands the
heap's free pages back to the kernel: glibc keeps memory freed by a worker
thread in that thread's arena, and a KV cache of a few MiB a layer, once freed,
stays resident there until something trims it (measured with SmolLM2-135M:
see docs/operations.md, "Memory after use").
"""

from __future__ import annotations

import ctypes
import resource
from pathlib import Path

import attrs

__all__ = ["HostMemory", "read_host_memory", "process_memory", "release_free_memory"]

_CGROUP_ROOT = Path("/sys/fs/cgroup")


@attrs.frozen
class HostMemory:
    """Memory still available to this process, by source (bytes; None: no such limit or not readable).

    Attributes:
        mem_available: /proc/meminfo MemAvailable (the kernel's estimate, page cache it could drop included).
        cgroup_room: the cgroup's memory.max minus its memory.current.
        address_space_room: RLIMIT_AS minus this process's VmSize.
    """

    mem_available: int | None
    cgroup_room: int | None = None
    address_space_room: int | None = None

    @property
    def available(self) -> int | None:
        """The smallest room of the sources present, or None if none could be read."""
        known = [v for v in (self.mem_available, self.cgroup_room, self.address_space_room) if v is not None]
        return min(known) if known else None

    def describe(self) -> str:
        """One line naming each source read, e.g. ``MemAvailable 20.1 GiB, cgroup room 3.0 GiB``."""
        parts = []
        for label, value in (("MemAvailable", self.mem_available), ("cgroup room", self.cgroup_room),
                             ("address-space room", self.address_space_room)):
            if value is not None:
                parts.append(f"{label} {value / 2**30:.2f} GiB")
        return ", ".join(parts) or "no memory figures readable"


def read_host_memory(proc: Path = Path("/proc"), cgroup_root: Path = _CGROUP_ROOT) -> HostMemory:
    """What this process may still take, now (call it after the weights are loaded)."""
    return HostMemory(mem_available=_meminfo(proc / "meminfo", "MemAvailable"),
                      cgroup_room=_cgroup_room(proc, cgroup_root), address_space_room=_address_space_room(proc))


def _meminfo(path: Path, field: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room(proc: Path, root: Path) -> int | None:
    """The limit minus the usage of this process's memory cgroup (v2, else v1); None without a limit."""
    v2, v1 = _cgroup_paths(proc)
    if v2 is not None:
        for folder in dict.fromkeys([root / v2, root]):  # its own cgroup; a container sees its own at the root
            limit = _read_int(folder / "memory.max")
            if limit is not None:
                return max(0, limit - (_read_int(folder / "memory.current") or 0))
    for folder in dict.fromkeys([root / "memory" / (v1 or ""), root / "memory"]):
        limit = _read_int(folder / "memory.limit_in_bytes")
        if limit is not None and limit < 2**60:  # v1 writes a huge number for "no limit"
            return max(0, limit - (_read_int(folder / "memory.usage_in_bytes") or 0))
    return None


def _cgroup_paths(proc: Path) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and v1 memory-controller path (relative, no leading slash), from /proc."""
    v2 = v1 = None
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            v2 = path.strip().lstrip("/")
        elif "memory" in controllers.split(","):
            v1 = path.strip().lstrip("/")
    return v2, v1


def _read_int(path: Path) -> int | None:
    """An integer file such as memory.max; None if missing, unreadable or "max" (no limit)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _address_space_room(proc: Path) -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    size = _meminfo(proc / "self" / "status", "VmSize")
    return None if size is None else max(0, soft - size)


def process_memory(proc: Path = Path("/proc")) -> dict[str, int | None]:
    """This process's resident memory (bytes; None where not readable).

    Returns:
        ``{"rss_bytes": VmRSS, "peak_rss_bytes": VmHWM}`` from ``/proc/self/status``.
    """
    return {"rss_bytes": _meminfo(proc / "self" / "status", "VmRSS"),
            "peak_rss_bytes": _meminfo(proc / "self" / "status", "VmHWM")}


def _malloc_trim() -> "ctypes._CFuncPtr | None":
    """glibc's ``malloc_trim``, or None on another C library (musl, macOS: nothing to call)."""
    try:
        return ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on, already loaded
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the kernel (glibc ``malloc_trim(0)``: every arena).

    A millisecond or two; call it from a worker thread when a burst of work
    has ended, not between steps.

    Returns:
        Whether there was a trim to call (glibc) and it released something.
    """
    return bool(_TRIM is not None and _TRIM(0))
