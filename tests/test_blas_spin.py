"""kestrel_trio.blas_spin: OpenBLAS's idle threads sleep about a millisecond after a product, not 0.1 s or more.

Each case runs a fresh interpreter (OpenBLAS reads its thread timeout once, when numpy loads) and
measures, from /proc/self/task/*/schedstat, how much CPU any other thread of it took in the 50 ms
that follow a threaded product, and whether one still runs or waits to run (state R) at their end. Neither
depends on the machine's load: a loaded machine gives a spinning thread less CPU, never more, and a spinning
thread stays runnable whether or not it gets a CPU.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from kestrel_trio.blas_spin import TIMEOUT_EXPONENTS

SUBPROCESS_TIMEOUT_S = 120  # a fresh interpreter importing kestrel_trio and numpy: seconds at most

PROBE = """
import os, sys, threading, time
if sys.argv[1] == "kestrel-first":
    import kestrel_trio
import numpy as np
import kestrel_trio

def cpu_ns_of_other_threads():
    me = threading.get_native_id()
    times = {}
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                times[tid] = int(stat.read().split()[0])
    return times

a = np.ones((512, 1024), np.float32)
b = np.ones((1024, 2048), np.float32)
for _ in range(4):
    a @ b  # big enough for OpenBLAS to hand half of it to its worker thread
time.sleep(0.005)
before = cpu_ns_of_other_threads()
time.sleep(0.05)
after = cpu_ns_of_other_threads()
print(max(after[t] - before.get(t, 0) for t in after) / 1e6)
me = threading.get_native_id()
states = []
for tid in os.listdir("/proc/self/task"):
    if int(tid) != me:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            states.append(stat.read().rpartition(")")[2].split()[0])
print("R" in states)
print(kestrel_trio.blas_spin.spin_timeout())
"""


def run_probe(order: str, **env: str) -> tuple[float, bool, str]:
    """(ms of CPU the busiest other thread took in the 50 ms after a product, whether another thread is runnable at
    their end, spin_timeout()) of a fresh process."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "OMP_NUM_THREADS")}
    result = subprocess.run([sys.executable, "-c", PROBE, order], env={**clean, "OPENBLAS_NUM_THREADS": "2", **env},
                            capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=True)
    spin_ms, runnable, setting = result.stdout.strip().splitlines()
    return float(spin_ms), runnable == "True", setting


def needs_a_spinning_worker() -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: OpenBLAS starts no worker thread to spin")
    if platform.machine().lower() not in TIMEOUT_EXPONENTS:
        pytest.skip(f"no spin timeout is set on {platform.machine()}")
    if not Path("/proc/self/schedstat").exists():
        pytest.skip("no /proc/self/schedstat to read threads' CPU time from")


def test_importing_kestrel_before_numpy_lets_blas_threads_sleep_within_milliseconds():
    needs_a_spinning_worker()
    ours, _, setting = run_probe("kestrel-first")
    default, default_spins, default_setting = run_probe("numpy-first")
    assert "set by kestrel_trio before numpy loaded" in setting
    assert "numpy was loaded before kestrel_trio" in default_setting
    # The default timeout (2^28 ticks: 0.1 s of a 2.6 GHz counter) keeps the worker spinning through the
    # window, so the probe sees it runnable at the end, however little CPU a loaded machine gave it.
    assert default_spins, f"the probe saw no spinning worker at OpenBLAS's default ({default:.1f} ms of CPU)"
    # A 2^22-tick timeout lets it sleep after a millisecond or two of the clock: its CPU in the window is at most
    # that (load only lowers it), against the 50 ms a default one takes on an idle CPU.
    assert ours < 5.0, f"a BLAS thread spun {ours:.1f} ms of the 50 ms after a product"


def test_a_timeout_from_the_environment_is_kept():
    _, _, setting = run_probe("kestrel-first", OPENBLAS_THREAD_TIMEOUT="25")
    assert setting == "OPENBLAS_THREAD_TIMEOUT=25 (from the environment)"
