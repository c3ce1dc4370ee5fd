"""A decode step's product runs shared or alone as its chooser says, every row once either way, and is timed."""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio._model.products import matmul
from kestrel_trio._model.products import share_choice
from kestrel_trio._model.decoder.decode_share import KINDS, SharedOrAlone, choosers
from kestrel_trio._model.products.product_threads import ProductThreads
from kestrel_trio._model.products.share_choice import BURST, ShareChooser


class _Threads:
    """The product threads' run(), in turn here, keeping each run's count of tasks."""

    def __init__(self, count: int = 2) -> None:
        self.count, self.runs = count, []

    def run(self, tasks, blas=True) -> None:
        assert not blas  # integer products: BLAS's thread count is left alone
        self.runs.append(len(tasks))
        for task in tasks:
            task()


class _Chooser(ShareChooser):
    """A chooser whose way is fixed, keeping what it was told."""

    def __init__(self, way: bool) -> None:
        super().__init__(prefer_shared=way)
        self.records = []

    def shared(self) -> bool:
        return self.prefer_shared

    def record(self, shared, seconds, weights) -> None:
        self.records.append((shared, seconds, weights))


def _product(rows: int, threads, chooser):
    """A SharedOrAlone over ``rows`` rows that counts, per row, how often it was written; and the stretches seen."""
    written, seen = np.zeros(rows, dtype=np.int64), []

    def tasks_for(stretches):
        seen.append(list(stretches))
        return [[lambda a=a, b=b: written.__setitem__(slice(a, b), written[a:b] + 1)] for a, b in stretches]

    return SharedOrAlone(threads, rows, tasks_for, rows * 64, chooser), written, seen


def test_both_ways_write_every_row_once_and_the_run_is_timed_for_the_chooser():
    for way in (True, False):
        threads, chooser = _Threads(), _Chooser(way)
        product, written, seen = _product(1024, threads, chooser)
        product()
        assert (written == 1).all()
        assert threads.runs == ([2] if way else [])  # alone: the product threads are not woken
        assert seen == [matmul._share_bounds(1024, 2), [(0, 1024)]]  # the stretches shared, and alone
        assert [(shared, weights) for shared, _, weights in chooser.records] == [(way, 1024 * 64)]


def test_the_choice_follows_the_costs(monkeypatch):
    monkeypatch.setattr(share_choice, "EXPLORE_EVERY", 2)
    monkeypatch.setattr(share_choice, "BURST", 2)
    threads, chooser = _Threads(), ShareChooser(prefer_shared=True)
    product, _, _ = _product(1024, threads, chooser)
    for _ in range(2):  # two shared products, then a burst of two alone (the second timed)
        product()
    chooser._cost[True] = 1.0  # the shared way's smoothed cost made dear: the next timing alone wins
    for _ in range(2):
        product()
    assert not chooser.prefer_shared and chooser.costs()["blas_threads"] is not None
    runs = len(threads.runs)
    product()
    assert len(threads.runs) == runs  # alone now


def test_every_kind_times_the_other_way_first_then_takes_the_cheaper():
    found = choosers()
    assert set(found) == set(KINDS) and all(c.prefer_shared for c in found.values())
    layers = found["qkv"]
    ways = []
    for _ in range(BURST + 2):
        way = layers.shared()
        layers.record(way, (1e-6 if way else 0.5e-6) * 1000, 1000)  # alone cheaper: taken once both are timed
        ways.append(way)
    assert ways == [False] * BURST + [True, False] and not layers.prefer_shared


def test_the_product_threads_leave_blas_alone_for_tasks_without_it():
    counts, done = [], []
    threads = ProductThreads(2, counts.append)
    try:
        threads.run([lambda: done.append(0), lambda: done.append(1)], blas=False)
        assert counts == [] and sorted(done) == [0, 1]
        threads.run([lambda: None, lambda: None])
        assert counts == [1, 2]  # one-thread BLAS while they ran, their count after
    finally:
        threads.stop()


def test_one_slow_run_does_not_send_a_kind_the_other_way_but_a_lasting_slowdown_does():
    chooser = ShareChooser(prefer_shared=True)
    chooser._cost[False] = 1.6e-9  # alone: 1.6 ns a weight, as a burst timed it
    product, _, _ = _product(1000, _Threads(), chooser)  # 64,000 weights

    def shared_run(seconds: float) -> None:
        chooser.record(True, product._clipped(True, seconds), 64_000)

    for _ in range(3):
        shared_run(64e-6)  # 1 ns a weight
    shared_run(6.4e-3)  # one run 100 times as slow (a helper kept off its core)
    assert chooser.prefer_shared  # counted as 3 times the usual run: 1.5 ns a weight smoothed, alone still dearer
    assert product._usual[True] == pytest.approx(64e-6 * 1.5)
    for _ in range(4):
        shared_run(6.4e-3)  # the machine stays busy: the shared way is left
    assert not chooser.prefer_shared
