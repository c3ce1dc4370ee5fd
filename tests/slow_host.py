"""Wall-clock allowances for a slow host: the aarch64 lane (.ci/arm-lane) runs the suite under qemu-user,
10-50x slower than native, and sets KESTREL_TEST_TIME_SCALE so that a client's timeout or a subprocess's bound
scales with it. Native runs keep the bounds as written (scale 1)."""

from __future__ import annotations

import os

TIME_SCALE = float(os.environ.get("KESTREL_TEST_TIME_SCALE") or 1)
if not TIME_SCALE >= 1:
    raise ValueError(f"KESTREL_TEST_TIME_SCALE must be 1 or more, not {TIME_SCALE}")


def allowance(seconds: float) -> float:
    """``seconds`` of a native run, scaled for this host."""
    return seconds * TIME_SCALE
