"""A one-sequence decode step's weight product: shared among the product threads, or the caller's alone.

Where the CPU has its own integer kernels the step shares its products as compiled job tables instead
(kestrel_trio._model.products.jobs: a hand-off of about a microsecond, so always shared); this choice serves the
products that go as Python tasks (the portable reference kernels).

Theory of operation: sharing a product hands a stretch of its rows to each
product thread and waits for them all; a hand-off wakes a blocked thread,
43 us of wall time (32 us of CPU) for two empty tasks on the 2-core Zen 5
VM. A Qwen3-0.6B decode step shares 112 products, most of them 50-200 us of
work: measured there, quiet, its Q4_K_M layers' products took 12.4 ms a
token shared between two threads and 12.4 ms on one (the output head, 155 M
weights, 7.5 ms alone and 3.75 ms shared). Beside other busy processes a
hand-off also waits for the helper to get a core: the shared products cost
several times the caller's own run.

So each kind of layer product of the step (the q/k/v, the output
projection, gate/up, down: 28 of each a Qwen3-0.6B token) keeps the recent
cost per weight of both ways and runs the cheaper, exploring the other now
and then (kestrel_trio._model.products.share_choice, as the general path's plain
products do). The head is always shared: one product a token gives too few
timings to steady the choice (in a trial at load 2, a few noisy ones sent
Q8_0's head alone for the next 64 tokens, at twice its shared cost), and
beside busy processes its two ways cost about the same. Both ways run the same compiled calls over the same rows, so the
logits do not depend on the choice, bit for bit.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

from kestrel_trio._model.products import matmul
from kestrel_trio._model.products.share_choice import EXPLORE_EVERY, SMOOTHING, ShareChooser

__all__ = ["KINDS", "SharedOrAlone", "choosers", "in_turn"]

KINDS = ("qkv", "o", "gate_up", "down")  # a decode step's kinds of layer product, each timed on its own
OUTLIER = 3.0  # a run's timing counts at most this many times the product's usual one


def choosers() -> dict[str, ShareChooser]:
    """A chooser per kind of layer product, each preferring shared until timings say otherwise, and timing the other
    way first of all (a burst at once), so that a model's first tokens already run the cheaper way."""
    return {kind: ShareChooser(prefer_shared=True, count=EXPLORE_EVERY) for kind in KINDS}


class SharedOrAlone:
    """A call without arguments running one product, shared among ``threads`` or all in the caller, as ``chooser``
    says; it times the run for the chooser as ``weights`` (the matrix's rows times columns). ``tasks_for(spans)``
    gives the product's calls for row stretches (a list of calls per stretch, each writing its own part of the
    output). The calls are compiled integer products: no BLAS, so the product threads leave its thread count as
    it is."""

    def __init__(self, threads, rows: int, tasks_for: Callable, weights: int, chooser: ShareChooser) -> None:
        self._shared = functools.partial(
            threads.run, [in_turn(task) for task in tasks_for(matmul._share_bounds(rows, threads.count))], blas=False)
        self._alone = [call for task in tasks_for([(0, rows)]) for call in task]
        self._weights, self._chooser = weights, chooser
        self._usual: dict[bool, float | None] = {False: None, True: None}  # seconds a run, each way, smoothed

    def __call__(self) -> None:
        chooser = self._chooser
        shared = chooser.shared()
        start = time.perf_counter()
        if shared:
            self._shared()
        else:
            for call in self._alone:
                call()
        chooser.record(shared, self._clipped(shared, time.perf_counter() - start), self._weights)

    def _clipped(self, shared: bool, seconds: float) -> float:
        """``seconds`` at most OUTLIER times this product's usual run that way: one run slowed by another process
        (a helper kept off its core a moment) then moves the chooser's smoothed cost by half at most, not enough to
        send the kind the slower way until its next burst; a lasting change still shows within a few runs."""
        usual = self._usual[shared]
        if usual is not None:
            seconds = min(seconds, OUTLIER * usual)
            seconds_usual = usual + SMOOTHING * (seconds - usual)
        else:
            seconds_usual = seconds
        self._usual[shared] = seconds_usual
        return seconds


def in_turn(calls: list[Callable[[], None]]) -> Callable[[], None]:
    """One product thread's task: its calls in turn."""
    def run() -> None:
        for call in calls:
            call()
    return run
