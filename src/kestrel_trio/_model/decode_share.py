"""A one-sequence decode step's weight product: shared among the product threads, or the caller's alone.

Theory of operation: sharing a product hands a stretch of its rows to each
product thread and waits for them all; a hand-off wakes a blocked thread,
43 us of wall time (32 us of CPU) for two empty tasks on the 2-core Zen 5
VM. A Qwen3-0.6B decode step shares 112 products, most of them 50-200 us of
work: measured there, quiet, its Q4_K_M layers' products took 12.4 ms a
token shared between two threads and 12.4 ms on one (the output head, 155 M
weights, 7.5 ms alone and 3.75 ms shared). Beside other busy processes a
hand-off also waits for the helper to get a core: the shared products cost
several times the caller's own run.

So each kind of product of the step (the q/k/v, the output projection,
gate/up, down, the head) keeps the recent cost per weight of both ways and
runs the cheaper, exploring the other now and then
(kestrel_trio._model.share_choice, as the general path's plain products
do); shared, the caller takes a larger stretch than the helpers, by as much
as their late start (:class:`Balance`). Every way runs the same compiled
calls over the same rows, in stretches aligned as the general path's, so the
logits do not depend on the choice, bit for bit.
"""

from __future__ import annotations

import time
from typing import Callable

from kestrel_trio._model import matmul
from kestrel_trio._model.share_choice import EXPLORE_EVERY, ShareChooser

__all__ = ["KINDS", "Balance", "SharedOrAlone", "balances", "choosers", "spans"]

KINDS = ("qkv", "o", "gate_up", "down", "head")  # a decode step's kinds of product, each timed on its own


HEAD_EXPLORE_EVERY, HEAD_BURST = 64, 4  # the head is one product a step: the other way tried every 64 steps, for 4


def balances() -> dict[str, Balance]:
    """A balance per kind of product, each starting with even stretches."""
    return {kind: Balance() for kind in KINDS}


def choosers() -> dict[str, ShareChooser]:
    """A chooser per kind of product, each preferring shared until timings say otherwise, and timing the other way
    first of all (a burst at once), so that a model's first tokens already run the cheaper way. The layers' kinds
    come 20-100 times a step and explore as the general path's products do."""
    found = {kind: ShareChooser(prefer_shared=True, count=EXPLORE_EVERY) for kind in KINDS}
    found["head"] = ShareChooser(prefer_shared=True, explore_every=HEAD_EXPLORE_EVERY, burst_size=HEAD_BURST,
                                 count=HEAD_EXPLORE_EVERY)
    return found


class Balance:
    """How much more of a kind of product's rows the caller takes than its even share, from who finished first.

    A helper starts its stretch a thread wake-up (tens of microseconds) after
    the caller starts its own: with even stretches the caller nearly always
    finishes first and then waits for a second wake-up, its own (measured
    under load on the 2-core VM: 98.7% of Qwen3-0.6B's shared products, a
    median 30 us wait after a 54 us half). Each time the caller waited, its
    level rises a quarter (a level is LEVEL_STEP of the rows); each time the
    helpers were done first, it falls a sixteenth: at the balance, the caller
    waits about one run in five.
    """

    UP, DOWN = 0.25, 0.0625  # in levels, after a run the caller waited / the helpers had finished

    def __init__(self) -> None:
        self.level = 0.0  # 0 to LEVELS - 1; the caller's share is 1/count + level * LEVEL_STEP of the rows

    def index(self) -> int:
        """The level to run at, a whole number."""
        return int(self.level + 0.5)

    def record(self, helpers_first: bool) -> None:
        self.level = max(0.0, self.level - self.DOWN) if helpers_first else min(LEVELS - 1.0, self.level + self.UP)


LEVELS, LEVEL_STEP = 5, 1 / 16  # the caller's share: its even one plus 0 to 4/16 of the rows


def spans(rows: int, count: int, level: int) -> list[tuple[int, int]]:
    """[start, stop) stretches of ``rows`` for ``count`` threads, SHARE_ALIGN-aligned, the caller's (the first)
    ``level`` steps of LEVEL_STEP larger than the others, which split the rest evenly."""
    even = matmul._share_bounds(rows, count)
    if level == 0 or len(even) < 2:
        return even
    align = matmul.SHARE_ALIGN
    caller = -(-int(rows * (1 / count + level * LEVEL_STEP)) // align) * align
    caller = min(caller, rows - align * (count - 1))  # every helper keeps a stretch
    if caller <= even[0][1]:
        return even
    return [(0, caller)] + [(caller + a, caller + b) for a, b in matmul._share_bounds(rows - caller, count - 1)]


class SharedOrAlone:
    """A call without arguments running one product, shared among ``threads`` or all in the caller, as ``chooser``
    says; it times the run for the chooser as ``weights`` (the matrix's rows times columns). ``tasks_for(spans)``
    gives the product's calls for row stretches (a list of calls per stretch, each writing its own part of the
    output); the stretches follow ``balance``. The calls are compiled integer products: no BLAS, so the product
    threads leave its thread count as it is."""

    def __init__(self, threads, rows: int, tasks_for: Callable, weights: int, chooser: ShareChooser,
                 balance: Balance) -> None:
        self._threads, self._rows, self._tasks_for = threads, rows, tasks_for
        self._shared: list[list | None] = [None] * LEVELS  # each level's tasks, made at its first run
        self._alone: list[Callable[[], None]] | None = None
        self._weights, self._chooser, self._balance = weights, chooser, balance

    def __call__(self) -> None:
        chooser = self._chooser
        shared = chooser.shared()
        start = time.perf_counter()
        if shared:
            level = self._balance.index()
            tasks = self._shared[level]
            if tasks is None:
                stretches = spans(self._rows, self._threads.count, level)
                tasks = self._shared[level] = [_sequence(task) for task in self._tasks_for(stretches)]
            self._balance.record(self._threads.run(tasks, blas=False))
        else:
            if self._alone is None:
                self._alone = [call for task in self._tasks_for([(0, self._rows)]) for call in task]
            for call in self._alone:
                call()
        chooser.record(shared, time.perf_counter() - start, self._weights)


def _sequence(calls: list[Callable[[], None]]) -> Callable[[], None]:
    """One product thread's task: its calls in turn."""
    def run() -> None:
        for call in calls:
            call()
    return run
