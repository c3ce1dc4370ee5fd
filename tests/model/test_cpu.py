"""What the kernels see of the CPU (_kernels.cpu): detection from a host's facts, any host's on any
host, and on this one the CPU numba really compiles for (its cache key)."""

from __future__ import annotations

import os
import platform
import struct
import warnings

import numpy as np
import pytest

from kestrel_trio import _kernels
from kestrel_trio._kernels import cpu

# /proc/cpuinfo of an RK3588 (four Cortex-A55, then four Cortex-A76), cut to two cores.
RK3588_CPUINFO = """processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x2
CPU part\t: 0xd05
CPU revision\t: 0

processor\t: 4
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 0
"""
# AT_HWCAP words as Linux reports them: Cortex-A76 (fp asimd ... fphp asimdhp ... asimddp) and Cortex-A53.
A76_HWCAP = 0b1_1111_1111_1111_1111_1011 | (1 << 20)
A53_HWCAP = 0b1111_1111  # fp asimd evtstrm aes pmull sha1 sha2 crc32
X86_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512_vnni amx_tile\n"


def test_an_rk3588_compiles_for_its_big_core_with_dotprod_and_fp16():
    found = cpu.detect("aarch64", {}, A76_HWCAP, 0, RK3588_CPUINFO)
    assert (found.name, found.features, found.source) == ("cortex-a76", ("dotprod", "fp16", "neon"), "AT_HWCAP")
    assert found.numba == {"NUMBA_CPU_NAME": "cortex-a76",
                           "NUMBA_CPU_FEATURES": "+neon,+fullfp16,+dotprod,-sve,-i8mm,-bf16"}
    assert found.describe() == "cortex-a76 dotprod fp16 neon"


def test_under_qemu_user_the_features_come_from_the_emulated_cpus_hwcap_and_the_name_is_llvms():
    """qemu-user's /proc/cpuinfo is the x86 host's: no CPU part, no Features line; AT_HWCAP is the guest's."""
    a53 = cpu.detect("aarch64", {}, A53_HWCAP, 0, X86_CPUINFO)
    assert (a53.name, a53.features) == ("host", ("neon",))
    assert "NUMBA_CPU_NAME" not in a53.numba
    assert a53.numba["NUMBA_CPU_FEATURES"] == "+neon,-fullfp16,-dotprod,-sve,-i8mm,-bf16"  # nothing it lacks
    told = cpu.detect("aarch64", {"NUMBA_CPU_NAME": "cortex-a76"}, A76_HWCAP, 0, X86_CPUINFO)
    assert (told.name, told.features) == ("cortex-a76", ("dotprod", "fp16", "neon"))
    assert "NUMBA_CPU_NAME" not in told.numba and "+dotprod" in told.numba["NUMBA_CPU_FEATURES"]


def test_the_users_numba_settings_win_and_are_reported_as_such():
    told = cpu.detect("aarch64", {"NUMBA_CPU_NAME": "cortex-a55", "NUMBA_CPU_FEATURES": "+neon,+dotprod"},
                      A76_HWCAP, 0, RK3588_CPUINFO)
    assert (told.name, told.features, told.source, dict(told.numba)) == (
        "cortex-a55", ("dotprod", "neon"), "NUMBA_CPU_FEATURES", {})


def test_a_core_missing_from_the_table_keeps_llvms_name_and_gets_the_features():
    apple = RK3588_CPUINFO.replace("0x41", "0x61")  # another implementer's part numbers are not Arm's
    found = cpu.detect("aarch64", {}, A76_HWCAP, 0, apple)
    assert found.name == "host" and set(found.numba) == {"NUMBA_CPU_FEATURES"}


def test_without_the_auxiliary_vector_cpuinfo_features_serve():
    found = cpu.detect("arm64", {}, None, None, RK3588_CPUINFO)
    assert (found.arch, found.features, found.source) == ("aarch64", ("dotprod", "fp16", "neon"), "/proc/cpuinfo")
    i8mm = cpu.detect("aarch64", {}, A76_HWCAP, 1 << 13, "")
    assert i8mm.has("i8mm") and "+i8mm" in i8mm.numba["NUMBA_CPU_FEATURES"]


def test_x86_keeps_llvms_own_detection_and_reports_the_flags_the_kernels_use():
    found = cpu.detect("x86_64", {}, None, None, X86_CPUINFO)
    assert (found.name, found.features, dict(found.numba)) == (
        "host", ("amx-tile", "avx2", "avx512f", "avx512vnni", "fma"), {})


def _auxv() -> dict[int, int]:
    """/proc/self/auxv read directly (the detection asks glibc's getauxval)."""
    with open("/proc/self/auxv", "rb") as f:
        raw = f.read()
    words = struct.unpack(f"{len(raw) // 8}Q", raw[: len(raw) // 8 * 8])
    return dict(zip(words[::2], words[1::2]))


# The features qemu's CPU models report (the aarch64 lane sets KESTREL_LANE_CPU to the one it emulates).
LANE_FEATURES = {"cortex-a76": ("dotprod", "fp16", "neon"), "cortex-a53": ("neon",)}


@pytest.mark.host_cpu
@pytest.mark.skipif(platform.machine() not in ("aarch64", "arm64"), reason="AT_HWCAP's arm64 bits")
def test_on_aarch64_this_process_sees_the_features_of_its_auxiliary_vector():
    auxv = _auxv()
    expected = cpu.detect("aarch64", {}, auxv[cpu.AT_HWCAP], auxv.get(cpu.AT_HWCAP2, 0), "").features
    found = cpu.this_cpu()
    if found.source != "NUMBA_CPU_FEATURES":
        assert found.features == expected
    lane = os.environ.get("KESTREL_LANE_CPU")
    if lane:
        assert expected == LANE_FEATURES[lane]


@pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason())
def test_numbas_cache_key_carries_the_cpu_and_features_it_compiles_for():
    """numba keys each cached function by (triple, CPU name, features): code for one CPU is never another's."""
    from numba.core.registry import cpu_target

    triple, name, features = cpu_target.target_context.codegen().magic_tuple()
    this = cpu.this_cpu()
    assert triple.startswith(this.arch)
    if this.numba or this.source == "NUMBA_CPU_FEATURES":  # aarch64: what configure_numba set (or the user did)
        assert name == this.name
        assert features == os.environ["NUMBA_CPU_FEATURES"]
    assert _kernels.describe_cpu().split()[0] == name


def test_the_float16_table_has_the_same_bits_on_every_architecture():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # aarch64's float16 cast warns on signalling NaNs; the table must not
        from kestrel_trio._kernels.portable.products import f16_table

        table = f16_table().view(np.uint32)  # [65536]
    bits = np.arange(1 << 16, dtype=np.uint32)
    with np.errstate(invalid="ignore"):
        cast = bits.astype(np.uint16).view(np.float16).astype(np.float32)
    nan = np.isnan(cast)
    np.testing.assert_array_equal(table[~nan], cast[~nan].view(np.uint32))  # finite and infinite values, exactly
    # Every NaN keeps its sign and payload (x86-64's cast does; aarch64's fcvt sets the quiet bit).
    expected = ((bits & 0x8000) << 16) | np.uint32(0x7F800000) | ((bits & 0x3FF) << 13)
    np.testing.assert_array_equal(table[nan], expected[nan])
    assert nan.sum() == 2 * 1023
