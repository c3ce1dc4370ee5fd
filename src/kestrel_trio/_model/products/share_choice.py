"""Whether a plain weight product runs on BLAS's own threads or is shared among kestrel's product threads.

Theory of operation: the two ways trade speed on an idle machine against
robustness on a busy one. BLAS's own threads hand work off in about a
microsecond, but between calls they spin-wait, yielding the core with
sched_yield; when any other process wants a core (even one at nice 19), the
yield hands it over and the next call waits for that process's time slice.
kestrel's product threads block on a queue instead: each hand-off costs a
thread wake-up (tens of microseconds), but nobody else's work stalls them.
Measured on the 2-core Xeon, the 1-row products of a Qwen3-0.6B decode step:
idle, 91-93 ms on BLAS's threads against 110-118 ms shared; beside a niced
busy process, 944 ms against 168 ms.

So each kind of product (by rows: one, a few, many) keeps the recent cost per
weight of both ways and runs the cheaper. Every ``EXPLORE_EVERY`` products it
runs a burst of ``BURST`` in the other way; the first half of the burst
warms that way up (BLAS's threads wake from sleep, caches refill), the second
half is timed. A change of load is thus noticed within a few hundred
products (a few decode steps) and costs, while nothing changes, one product
in about a hundred run the slower way.
"""

from __future__ import annotations

import attrs

__all__ = ["ShareChooser", "EXPLORE_EVERY", "BURST"]

EXPLORE_EVERY = 512  # products between two bursts the other way
BURST = 16  # products of a burst: the first half warms up, the second half is timed
SMOOTHING = 0.25  # weight of a new timing in the running cost


@attrs.define
class ShareChooser:
    """The way (shared or not) to run the next product of one kind, from the timings of the last ones.

    Call :meth:`shared` before a product, then :meth:`record` with what it
    cost. Not locked: two forward threads racing on it only blur a timing.

    Attributes:
        prefer_shared: the way run outside bursts, until timings say otherwise.
    """

    prefer_shared: bool = False
    _cost: dict = attrs.field(factory=lambda: {False: None, True: None})  # seconds per weight, smoothed
    _count: int = 0  # products since the last burst ended
    _burst: int = -1  # products into the current burst, -1 outside one

    def shared(self) -> bool:
        """Whether the next product should be shared among the product threads."""
        if self._burst < 0 and self._count >= EXPLORE_EVERY:
            self._burst = 0
        if self._burst >= 0:
            return not self.prefer_shared
        return self.prefer_shared

    def record(self, shared: bool, seconds: float, weights: int) -> None:
        """Note that a product of ``weights`` weights (times rows) took ``seconds`` the way ``shared`` says."""
        timed = self._burst < 0 or self._burst >= BURST // 2
        if timed and weights > 0:
            cost = seconds / weights
            old = self._cost[shared]
            self._cost[shared] = cost if old is None else old + SMOOTHING * (cost - old)
        if self._burst >= 0:
            self._burst += 1
            if self._burst >= BURST:
                self._burst, self._count = -1, 0
                self._choose()
        else:
            self._count += 1
            self._choose()

    def _choose(self) -> None:
        mine, other = self._cost[self.prefer_shared], self._cost[not self.prefer_shared]
        if mine is not None and other is not None and other < mine:
            self.prefer_shared = not self.prefer_shared

    def costs(self) -> dict[str, float | None]:
        """The smoothed cost of each way, in nanoseconds per weight (None: not timed yet)."""
        return {("product_threads" if way else "blas_threads"): (None if c is None else c * 1e9)
                for way, c in self._cost.items()}
