"""What this CPU is, once: its architecture, the features the kernels care about, and the CPU numba compiles for.

Theory of operation: numba asks LLVM for the host CPU (``get_host_cpu_name``
and ``get_host_cpu_features``). On x86-64 LLVM reads CPUID and is right. On
aarch64 Linux it reads ``/proc/cpuinfo``, which is wrong in two places a
board user meets: under qemu-user (the emulated CPU's ``/proc/cpuinfo`` is
the x86 host's, so LLVM says ``generic`` and drops dotprod), and on a
big.LITTLE board, where the name LLVM picks need not be the big core's. The
kernel's ``AT_HWCAP`` words are right in both: Linux reports there the
features every core has, and qemu-user reports the emulated CPU's.

So on aarch64 the features numba compiles with come from ``AT_HWCAP`` (and
``AT_HWCAP2``): ``NUMBA_CPU_FEATURES`` is set to them, a feature the CPU
lacks spelled as ``-feature`` so that no CPU name can imply it; and the
CPU name from ``/proc/cpuinfo``'s ``CPU part`` lines (the big core's where
there are two; LLVM's own name where the part is not in our table or there
is none: under emulation LLVM says ``generic``). A
``NUMBA_CPU_NAME`` or ``NUMBA_CPU_FEATURES`` already in the environment
wins (``NUMBA_CPU_NAME=cortex-a76`` makes an emulated lane compile what the
board compiles). numba's on-disk cache keys each compiled function by the
target triple, this CPU name and this feature string
(``CPUCodegen.magic_tuple``), so code compiled for one CPU is never handed
to another. On x86-64 nothing is set: LLVM's own detection stands.

:func:`detect` is pure given its inputs, so any CPU can be described on any
host (tests pass the auxiliary vector and cpuinfo of a board).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import platform
import sys
from typing import Mapping

__all__ = ["Cpu", "Features", "detect", "this_cpu", "configure_numba", "read_hwcaps", "kernel_features"]

# Linux's auxiliary vector entries (elf.h) and arm64's bits in them (arch/arm64/include/uapi/asm/hwcap.h).
AT_HWCAP = 16
AT_HWCAP2 = 26
_ARM_HWCAP = {"neon": 1 << 1, "fp16": 1 << 10, "dotprod": 1 << 20, "sve": 1 << 22}  # asimd, asimdhp, asimddp, sve
_ARM_HWCAP2 = {"i8mm": 1 << 13, "bf16": 1 << 14}
# The same features as /proc/cpuinfo's "Features" line names them (a fallback where the auxiliary vector is not
# readable).
_ARM_CPUINFO = {"asimd": "neon", "asimdhp": "fp16", "asimddp": "dotprod", "sve": "sve", "i8mm": "i8mm",
                "bf16": "bf16"}
# Our feature name -> LLVM's AArch64 target feature.
_LLVM_ARM = {"neon": "neon", "fp16": "fullfp16", "dotprod": "dotprod", "sve": "sve", "i8mm": "i8mm", "bf16": "bf16"}
# Arm Ltd's "CPU part" numbers (implementer 0x41) -> LLVM's CPU name, the cores boards carry. Little cores are
# listed so that a big.LITTLE board tunes for its big one (the features are every core's, from AT_HWCAP).
_ARM_PARTS = {0xD03: "cortex-a53", 0xD04: "cortex-a35", 0xD05: "cortex-a55", 0xD07: "cortex-a57", 0xD08: "cortex-a72",
              0xD09: "cortex-a73", 0xD0A: "cortex-a75", 0xD0B: "cortex-a76", 0xD0C: "neoverse-n1",
              0xD0D: "cortex-a77", 0xD40: "neoverse-v1", 0xD41: "cortex-a78", 0xD44: "cortex-x1", 0xD46: "cortex-a510",
              0xD47: "cortex-a710", 0xD48: "cortex-x2", 0xD49: "neoverse-n2", 0xD4B: "cortex-a78c",
              0xD4D: "cortex-a715", 0xD4E: "cortex-x3", 0xD80: "cortex-a520", 0xD81: "cortex-a720"}
_LITTLE = frozenset({"cortex-a35", "cortex-a53", "cortex-a55", "cortex-a510", "cortex-a520"})
# x86-64: /proc/cpuinfo's flags that some kernel of ours needs (the assembly blocks, the AMX tiles) or a
# future one would (VNNI), under the names we print.
_X86_FLAGS = {"avx2": "avx2", "fma": "fma", "avx512f": "avx512f", "avx512_vnni": "avx512vnni", "avx_vnni": "avxvnni",
              "avx512_bf16": "avx512bf16", "amx_tile": "amx-tile", "amx_bf16": "amx-bf16", "amx_int8": "amx-int8"}


@dataclasses.dataclass(frozen=True)
class Cpu:
    """This process's CPU as the kernels see it.

    Attributes:
        arch: ``platform.machine()`` normalized: "aarch64", "x86_64", or what it said.
        name: the CPU numba compiles for ("cortex-a76"; "host": LLVM's own detection, as on x86-64).
        features: the features the kernels care about that this CPU has, sorted ("dotprod", "fp16", "neon").
        source: where the features came from ("AT_HWCAP", "/proc/cpuinfo", "NUMBA_CPU_FEATURES", "none").
        numba: the environment settings that make numba compile for it ({} where LLVM's own detection stands).
    """

    arch: str
    name: str
    features: tuple[str, ...]
    source: str
    numba: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        """One line: the CPU numba compiles for and the features seen, sorted: "cortex-a76 dotprod fp16 neon"."""
        return " ".join((self.name, *self.features))

    def has(self, feature: str) -> bool:
        return feature in self.features


def detect(machine: str, environ: Mapping[str, str], hwcap: int | None, hwcap2: int | None,
           cpuinfo: str) -> Cpu:
    """The Cpu of a host given its facts: ``platform.machine()``, the environment, ``AT_HWCAP``/``AT_HWCAP2``
    (None where unreadable) and the text of /proc/cpuinfo ("" where there is none)."""
    arch = {"arm64": "aarch64", "amd64": "x86_64", "x64": "x86_64"}.get(machine.lower(), machine.lower())
    if arch == "aarch64":
        return _arm(environ, hwcap, hwcap2, cpuinfo)
    if arch == "x86_64":
        flags = _cpuinfo_field(cpuinfo, "flags").split()
        features = tuple(sorted(ours for flag, ours in _X86_FLAGS.items() if flag in flags))
        return Cpu(arch, environ.get("NUMBA_CPU_NAME") or "host", features, "/proc/cpuinfo" if cpuinfo else "none")
    return Cpu(arch, environ.get("NUMBA_CPU_NAME") or "host", (), "none")


def _arm(environ: Mapping[str, str], hwcap: int | None, hwcap2: int | None, cpuinfo: str) -> Cpu:
    if hwcap is not None:
        seen = {f for f, bit in _ARM_HWCAP.items() if hwcap & bit}
        seen |= {f for f, bit in _ARM_HWCAP2.items() if (hwcap2 or 0) & bit}
        source = "AT_HWCAP"
    else:
        listed = _cpuinfo_field(cpuinfo, "Features").split()
        seen = {ours for flag, ours in _ARM_CPUINFO.items() if flag in listed}
        source = "/proc/cpuinfo" if listed else "none"
    numba: dict[str, str] = {}
    name = environ.get("NUMBA_CPU_NAME") or _arm_core(cpuinfo)
    if name is None:
        name = "host"  # a core not in the table, or none listed (qemu-user): LLVM's own name for it
    elif not environ.get("NUMBA_CPU_NAME"):
        numba["NUMBA_CPU_NAME"] = name
    if environ.get("NUMBA_CPU_FEATURES"):  # the user's word: report it as what the code is compiled with
        wanted = set(environ["NUMBA_CPU_FEATURES"].split(","))
        seen = {f for f, llvm in _LLVM_ARM.items() if f"+{llvm}" in wanted}
        source = "NUMBA_CPU_FEATURES"
    elif source != "none":
        numba["NUMBA_CPU_FEATURES"] = ",".join(("+" if f in seen else "-") + llvm for f, llvm in _LLVM_ARM.items())
    return Cpu("aarch64", name, tuple(sorted(seen)), source, numba)


def _arm_core(cpuinfo: str) -> str | None:
    """LLVM's name for the biggest core of the table /proc/cpuinfo lists; None where it lists none of them."""
    names, implementer = [], None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "CPU implementer":
            implementer = value
        elif key == "CPU part" and implementer == "0x41":  # Arm Ltd's own cores: other vendors number theirs
            try:
                names.append(_ARM_PARTS.get(int(value, 16)))
            except ValueError:
                continue
    known = [n for n in names if n is not None]
    big = [n for n in known if n not in _LITTLE]
    return (big or known or [None])[0]


def _cpuinfo_field(cpuinfo: str, field: str) -> str:
    """The first value of ``field`` in /proc/cpuinfo's text ("" if absent)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == field:
            return value.strip()
    return ""


def read_hwcaps() -> tuple[int | None, int | None]:
    """This process's ``AT_HWCAP`` and ``AT_HWCAP2`` (glibc's getauxval), (None, None) off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None, None
    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return None, None
    getauxval.argtypes = [ctypes.c_ulong]
    getauxval.restype = ctypes.c_ulong
    return int(getauxval(AT_HWCAP)), int(getauxval(AT_HWCAP2))


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return f.read(1 << 20)  # a 192-core machine's is about 300 KiB; the first core's lines come first
    except OSError:
        return ""


_found: list[Cpu] = []


def this_cpu() -> Cpu:
    """This host's Cpu, detected on the first call (the environment as it was then)."""
    if not _found:
        _found.append(detect(platform.machine(), os.environ, *read_hwcaps(), _read_cpuinfo()))
    return _found[0]


def configure_numba() -> Cpu:
    """Set ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` for this CPU where they are unset (aarch64 only), before
    numba compiles or loads anything; this host's Cpu."""
    cpu = this_cpu()
    for key, value in cpu.numba.items():
        os.environ.setdefault(key, value)
    return cpu


@dataclasses.dataclass(frozen=True)
class Features:
    """The facts about a CPU that choose its kernels (:func:`kernel_features` gathers a host's;
    kestrel_trio._kernels.plan.plan chooses from them).

    Attributes:
        arch: "x86_64", "aarch64" or another ``platform.machine()``.
        os: ``sys.platform`` ("linux": AMX tiles need Linux's permission call).
        cpu: LLVM's name for the CPU ("znver5", "sapphirerapids", "cortex-a76"; "generic" where unknown).
        runs: the features the CPU executes, LLVM's names ("avx2", "fma", "avx512f", "avxvnni", "avx512vnni",
            "amx-tile", "amx-bf16"; "neon", "dotprod", "i8mm").
        target: the CPU numba compiles for (``NUMBA_CPU_NAME``; "host": the CPU itself).
        target_features: the features ``NUMBA_CPU_FEATURES`` enables (its "+" items), None where it is unset.
        compiled: x86-64 only, the features among avx2, f16c, fma, avxvnni, avx512vnni, avx512vl, avx512bw that
            numba's code holds (kestrel_trio._kernels.x86.integer.compiled_features); empty elsewhere.
    """

    arch: str
    os: str
    cpu: str
    runs: frozenset[str]
    target: str = "host"
    target_features: frozenset[str] | None = None
    compiled: frozenset[str] = frozenset()


# x86-64 features (LLVM's names) that choose a kernel (kestrel_trio._kernels.plan).
_X86_KERNEL_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512bw", "avxvnni", "avx512vnni",
                        "amx-tile", "amx-bf16")


def kernel_features() -> Features:
    """This host's facts for kestrel_trio._kernels.plan.plan: the probing its pure choice leaves out.

    Imports llvmlite (LLVM's host CPU name and features) and, on x86-64, numba (the features numba's code holds,
    kestrel_trio._kernels.x86.integer.compiled_features). On x86-64 a feature counts where LLVM's CPUID reading
    has it and /proc/cpuinfo, where readable, lists it too (the kernel drops a feature there whose state it does
    not save). On aarch64 the features are :func:`this_cpu`'s (``AT_HWCAP``).
    """
    import llvmlite.binding as llvm_binding

    cpu = this_cpu()
    target = os.environ.get("NUMBA_CPU_NAME") or "host"
    listed = os.environ.get("NUMBA_CPU_FEATURES")
    wanted = frozenset(item[1:] for item in listed.split(",") if item.startswith("+")) if listed else None
    name = llvm_binding.get_host_cpu_name()
    if cpu.arch == "x86_64":
        from kestrel_trio._kernels.x86.integer import compiled_features

        host = llvm_binding.get_host_cpu_features()
        runs = {f for f in _X86_KERNEL_FEATURES if host.get(f, False)}
        if cpu.source != "none":  # the features cpu.detect reads from /proc/cpuinfo
            runs = {f for f in runs if f not in _X86_FLAGS.values() or cpu.has(f)}
        return Features(cpu.arch, sys.platform, name, frozenset(runs), target, wanted, compiled_features())
    if cpu.arch == "aarch64" and cpu.name != "host":
        name = cpu.name
    return Features(cpu.arch, sys.platform, name, frozenset(cpu.features), target, wanted)
