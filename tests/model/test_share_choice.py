"""The choice between BLAS's own threads and kestrel's product threads (sans-IO: timings are fed in)."""

from __future__ import annotations

import numpy as np
import pytest

from kestrel_trio._model.products import matmul
from kestrel_trio._model.products.backend import current
from kestrel_trio._model.products.share_choice import BURST, EXPLORE_EVERY, ShareChooser


def run(chooser: ShareChooser, products: int, cost: dict[bool, float]) -> list[bool]:
    """``products`` products, each costing cost[way] seconds a weight; the ways taken."""
    ways = []
    for _ in range(products):
        way = chooser.shared()
        chooser.record(way, cost[way] * 1000, 1000)
        ways.append(way)
    return ways


def test_the_cheaper_way_is_kept_and_the_other_is_tried_in_bursts():
    chooser = ShareChooser()
    ways = run(chooser, EXPLORE_EVERY + BURST + 10, {False: 1e-10, True: 2e-10})
    assert ways[:EXPLORE_EVERY] == [False] * EXPLORE_EVERY
    assert ways[EXPLORE_EVERY : EXPLORE_EVERY + BURST] == [True] * BURST  # the burst the other way
    assert ways[EXPLORE_EVERY + BURST :] == [False] * 10 and not chooser.prefer_shared


def test_a_way_that_becomes_slower_is_left_once_the_other_has_been_timed_and_taken_again_when_it_recovers():
    chooser = ShareChooser()
    run(chooser, EXPLORE_EVERY + BURST, {False: 1e-10, True: 2e-10})  # both timed, BLAS's threads cheaper
    busy = run(chooser, 20, {False: 9e-10, True: 2e-10})  # beside a busy process
    assert chooser.prefer_shared and busy[-10:] == [True] * 10
    idle = run(chooser, EXPLORE_EVERY + BURST + 5, {False: 1e-10, True: 2e-10})
    assert not chooser.prefer_shared and idle[-5:] == [False] * 5


def test_the_first_half_of_a_burst_only_warms_up():
    chooser = ShareChooser()
    run(chooser, EXPLORE_EVERY, {False: 1e-10, True: 0.0})
    for k in range(BURST):  # the burst: slow while warming, cheap once warm
        way = chooser.shared()
        assert way is True
        chooser.record(way, (5e-10 if k < BURST // 2 else 0.5e-10) * 1000, 1000)
    assert chooser.prefer_shared, "the warm half alone decides, and it was cheaper"
    assert chooser.costs()["product_threads"] == pytest.approx(0.05)  # ns a weight: the warm timings only


def test_both_ways_compute_the_same_product():
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((2048, 256)).astype(np.float32)  # [out, in], above SHARE_MIN_ELEMENTS
    x = rng.standard_normal((1, 256)).astype(np.float32)  # [1, in]
    matmul.set_product_threads(2)
    try:
        chooser = current().share_choosers["one"]  # outside any model: the defaults'
        before = chooser.prefer_shared
        results = {}
        for way in (False, True):
            chooser.prefer_shared = way
            results[way] = matmul.linear(x, weight)  # [1, out]
        chooser.prefer_shared = before
    finally:
        matmul.set_product_threads(1)
    np.testing.assert_allclose(results[True], results[False], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(results[False], x @ weight.T, rtol=1e-5, atol=1e-5)
