"""How long OpenBLAS's idle threads spin before they sleep: about a millisecond, set before numpy loads.

Theory of operation: after a threaded product, each of OpenBLAS's worker
threads spins (calling sched_yield) until its next job or until its timer
has advanced by its thread timeout, and only then sleeps. The timeout is
2^28 timer ticks unless ``OPENBLAS_THREAD_TIMEOUT`` (an exponent, 4-30) says
otherwise, and OpenBLAS reads it once, when the library loads (numpy's
import). 2^28 ticks of a 2.6 GHz x86 time-stamp counter are 0.1 s; of the
24 MHz generic timer of an RK3588, 11 s. A spinning worker holds a core away
from kestrel's own product threads: on the 2-core Zen 5, with the product in
BLAS's threads and the attention that follows it shared among the product
threads, a 512-token prefill of Qwen3-0.6B's shapes spent 0.38-0.47 s in
attention at the default against 0.24-0.28 s with a 2^22-tick timeout, its
products unchanged. The gaps between the products of one decode step are
far shorter than a millisecond, so BLAS's threads still never sleep inside a
step.

So importing kestrel_trio sets ``OPENBLAS_THREAD_TIMEOUT`` (unless it is set
already) to about a millisecond of the platform's timer, when numpy is not
loaded yet. Once numpy is loaded, setting it would change nothing:
:func:`spin_timeout` says which case this process is in.
"""

from __future__ import annotations

import os
import platform
import sys

__all__ = ["spin_timeout", "TIMEOUT_EXPONENTS"]

# Machine -> timeout exponent (ticks of OpenBLAS's timer, rpcc). x86-64 counts time-stamp-counter cycles
# (2-4 GHz): 2^22 is 1-2 ms. arm64 counts the generic timer (24 MHz on Rockchip and Allwinner boards,
# 54 MHz on a Raspberry Pi 4, 1 GHz from Armv8.6): 2^16 is 2.7 ms / 1.2 ms / 66 us.
TIMEOUT_EXPONENTS = {"x86_64": 22, "amd64": 22, "aarch64": 16, "arm64": 16}
_VARIABLE = "OPENBLAS_THREAD_TIMEOUT"


def _apply() -> str:
    """Set the timeout if it still matters here; what became of it, in a few words."""
    if _VARIABLE in os.environ:
        return f"{_VARIABLE}={os.environ[_VARIABLE]} (from the environment)"
    exponent = TIMEOUT_EXPONENTS.get(platform.machine().lower())
    if exponent is None:
        return f"OpenBLAS's default thread timeout (no setting for {platform.machine()})"
    if "numpy" in sys.modules:
        return "OpenBLAS's default thread timeout (numpy was loaded before kestrel_trio)"
    os.environ[_VARIABLE] = str(exponent)
    return f"{_VARIABLE}={exponent} (set by kestrel_trio before numpy loaded)"


_SETTING = _apply()


def spin_timeout() -> str:
    """How long this process's OpenBLAS threads spin when idle, as set at import (for reports and logs)."""
    return _SETTING
