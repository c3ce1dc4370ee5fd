"""A decode step's product runs shared or alone as its chooser says, the same calls either way, and is timed."""

from __future__ import annotations

from kestrel_trio._model import matmul
from kestrel_trio._model.decode_share import HEAD_BURST, HEAD_EXPLORE_EVERY, KINDS, SharedOrAlone, choosers
from kestrel_trio._model.share_choice import ShareChooser


class _Threads:
    """The product threads' run(), in turn here, counting its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def run(self, tasks, blas=True) -> None:
        assert not blas  # integer products: BLAS's thread count is left alone
        self.runs += 1
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


def test_both_ways_run_every_call_once_and_the_run_is_timed_for_the_chooser():
    for way in (True, False):
        done, threads, chooser = [], _Threads(), _Chooser(way)
        tasks = [[lambda: done.append("a0"), lambda: done.append("a1")], [lambda: done.append("b0")]]
        SharedOrAlone(threads, tasks, 4096, chooser)()
        assert sorted(done) == ["a0", "a1", "b0"]
        assert threads.runs == (1 if way else 0)  # alone: the product threads are not woken
        assert [(shared, weights) for shared, _, weights in chooser.records] == [(way, 4096)]
        assert chooser.records[0][1] >= 0


def test_the_choice_follows_the_costs():
    threads, chooser = _Threads(), ShareChooser(prefer_shared=True, explore_every=2, burst_size=2)
    product = SharedOrAlone(threads, [[lambda: None], [lambda: None]], 1000, chooser)
    for _ in range(2):  # two shared products, then a burst of two alone (the second timed)
        product()
    chooser._cost[True] = 1.0  # the shared way's smoothed cost made dear: the next timing alone wins
    for _ in range(2):
        product()
    assert not chooser.prefer_shared and chooser.costs()["blas_threads"] is not None
    runs = threads.runs
    product()
    assert threads.runs == runs  # alone now


def test_every_kind_has_its_chooser_starting_shared_and_the_head_explores_in_short_bursts():
    found = choosers()
    assert set(found) == set(KINDS) and all(c.prefer_shared for c in found.values())
    assert (found["head"].explore_every, found["head"].burst_size) == (HEAD_EXPLORE_EVERY, HEAD_BURST)
    ways = []
    for _ in range(HEAD_EXPLORE_EVERY + HEAD_BURST + 1):
        way = found["head"].shared()
        found["head"].record(way, 1e-6, 1000)
        ways.append(way)
    assert ways == [True] * HEAD_EXPLORE_EVERY + [False] * HEAD_BURST + [True]


def test_the_product_threads_leave_blas_alone_for_tasks_without_it():
    counts = []
    threads = matmul._ProductThreads(2, counts.append)
    try:
        threads.run([lambda: None, lambda: None], blas=False)
        assert counts == []
        threads.run([lambda: None, lambda: None])
        assert counts == [1, 2]  # one-thread BLAS while they ran, their count after
    finally:
        threads.stop()
