"""One backend per loaded model: two models in one process keep their own kernel settings.

A model's products mode and prefill precision are fixed at its load (kestrel_trio._model.products.backend) and held
by its decoder: another model's load, or the defaults changed later, leave it as it was, and two models stepping at the
same time in two threads each run in their own.
"""

from __future__ import annotations

import threading
from pathlib import Path

import attrs
import numpy as np
import pytest
import trio

from kestrel_trio import _kernels
from kestrel_trio._model import Backend
from kestrel_trio._model.products import matmul
from kestrel_trio._model.products.backend import current, defaults, product_threads
from kestrel_trio._model.products.product_threads import ProductThreads
from kestrel_trio.errors import ModelLoadError
from kestrel_trio.model import load_model, set_blas_threads, set_products
from kestrel_trio.server import serve

GGUF = Path(__file__).resolve().parents[1] / "fixtures" / "gguf" / "qwen3_quant" / "qwen3_quant.gguf"
IDS = [3, 17, 255, 100, 9, 42, 7]  # within the fixture's 512-token vocabulary
THREAD_TIMEOUT = 120.0  # seconds a stepping thread may take on a loaded 2-core machine

needs_kernels = pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason() or "no numba")


def _logits(model) -> np.ndarray:
    """The prompt's logits, then two decode steps' (a step of one row takes the decode step's own path)."""
    cache = model.new_cache()
    rows = [model.prefill(cache, IDS)]
    for _ in range(2):
        rows.append(model.step(cache, [int(np.argmax(rows[-1]))]))  # [vocab]
    return np.stack(rows)  # [3, vocab]


@needs_kernels
def test_two_models_keep_their_own_products_whatever_is_loaded_after():
    exact = load_model(GGUF, products="exact")
    alone = _logits(exact)
    integer = load_model(GGUF, products="integer")  # once a process-wide switch: the exact model stepped integer
    rounded = _logits(integer)
    assert not np.array_equal(rounded, alone)  # the modes differ here (the activations' rounding)
    assert np.array_equal(_logits(exact), alone)  # bit for bit: the first model's products are its own still
    assert exact.decoder.backend.products == "exact" and integer.decoder.backend.products == "integer"
    assert exact.kernel_report()["products"]["Q8_0"] == "portable"
    assert integer.kernel_report()["products"]["Q8_0"] != "portable"
    assert np.array_equal(_logits(load_model(GGUF, products="integer")), rounded)  # and the second's, as alone


@needs_kernels
def test_two_models_stepping_at_once_in_two_threads_each_run_in_their_own():
    models = {"exact": load_model(GGUF, products="exact"), "integer": load_model(GGUF, products="integer")}
    alone = {mode: _logits(model) for mode, model in models.items()}
    found: dict[str, list] = {mode: [] for mode in models}

    def run(mode: str) -> None:
        for _ in range(3):
            found[mode].append(_logits(models[mode]))

    threads = [threading.Thread(target=run, args=(mode,)) for mode in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_TIMEOUT)
        assert not thread.is_alive()
    for mode, runs in found.items():
        assert len(runs) == 3 and all(np.array_equal(logits, alone[mode]) for logits in runs)


@needs_kernels
def test_the_defaults_go_to_models_loaded_later_and_leave_loaded_ones_alone():
    before = load_model(GGUF)  # the suite's default: exact (conftest)
    assert before.decoder.backend == Backend(products="exact")
    set_products("integer")
    try:
        after = load_model(GGUF)
    finally:
        set_products("exact")
    assert before.decoder.backend.products == "exact" and after.decoder.backend.products == "integer"
    assert current().products == "exact"  # outside any model: the defaults, as set back


def test_two_models_keep_their_own_product_threads_and_small_batch_call():
    pytest.importorskip("threadpoolctl")
    before = product_threads() or 1
    try:
        one = load_model(GGUF, blas_threads=1)
        two = load_model(GGUF, blas_threads=2)  # once process-wide: the first model's products shared by 2 too
        assert one.decoder.backend.threads is None and one.decoder.backend.thread_count == 1
        assert two.decoder.backend.threads.count == 2
        with one.decoder.backend.active():
            assert matmul.shares_of(4) == [(0, 4)]
            matmul.set_small_batch_call("weight_left")
        with two.decoder.backend.active():
            assert matmul.shares_of(4) == [(0, 2), (2, 4)]
            matmul.set_small_batch_call("row_blocks")
        with one.decoder.backend.active():
            assert matmul.small_batch_call() == "weight_left"  # each model's own, whatever the other forced
        assert two.decoder.backend.small_batch.call == "row_blocks"
        assert current().small_batch is not one.decoder.backend.small_batch  # nor the defaults'
    finally:
        set_blas_threads(before)


def test_a_pool_no_backend_holds_stops_its_threads():
    others = set(threading.enumerate())
    pool = ProductThreads(2)
    helpers = [t for t in threading.enumerate() if t not in others]  # this pool's one helper
    pool.run([lambda: None, lambda: None])
    del pool  # the defaults replaced and its models gone: nothing holds it
    for thread in helpers:
        thread.join(THREAD_TIMEOUT)
    assert [t.name for t in helpers] == ["kestrel-product-1"] and not helpers[0].is_alive()


def test_blas_goes_back_to_many_threads_only_when_no_pool_shares_a_product():
    """numpy's BLAS count is one per process: two models' pools sharing at once must not undo each other's one
    thread."""
    counts = []
    first, second = ProductThreads(2, counts.append), ProductThreads(3, counts.append)
    try:
        with first.one_thread_blas():
            with second.one_thread_blas():  # another model's step, meanwhile (same thread here: the count is global)
                assert counts == [1]
            assert counts == [1]  # the second pool's window closed while the first's is open: still one thread
        assert counts == [1, 2]
    finally:
        first.stop()
        second.stop()


@needs_kernels
def test_a_model_carries_the_hosts_kernel_plan_and_names_its_kernels_by_it():
    from kestrel_trio._kernels import plan

    model = load_model(GGUF, products="auto")
    backend = model.decoder.backend
    assert backend.plan is plan.this_plan() and defaults().plan is None  # the defaults read the host's per call
    report = model.kernel_report()["products"]
    assert backend.product_kernels(set(report)) == report
    board = attrs.evolve(backend, plan=plan.plan(plan.SAMPLE_CPUS["cortex-a76 (RK3588 big core)"]))
    assert board.product_kernels({"Q8_0", "Q6_K", "F32"}) == {"Q8_0": "sdot", "Q6_K": "sdot", "F32": "portable"}
    small = attrs.evolve(board, plan=plan.plan(plan.SAMPLE_CPUS["cortex-a53 (no dotprod)"]), products="exact")
    assert small.product_kernels({"Q8_0"}) == {"Q8_0": "portable"}


def test_a_bad_setting_is_refused_at_load_naming_it():
    with pytest.raises(ValueError, match="products must be one of auto, exact, integer, got 'fast'"):
        Backend(products="fast")
    with pytest.raises(ModelLoadError, match="products must be one of auto, exact, integer, got 'fast'"):
        load_model(GGUF, products="fast")
    with pytest.raises(ModelLoadError, match="unknown prefill precision 'fp16'"):
        load_model(GGUF, prefill_precision="fp16")


def test_a_backend_is_current_inside_and_the_one_before_after():
    outer, inner = Backend(products="integer"), Backend(products="auto")
    default = current()
    with outer.active():
        assert current() is outer
        with inner.active():
            assert current() is inner
        assert current() is outer
        seen = []
        thread = threading.Thread(target=lambda: seen.append(current()))  # a new thread: its own context
        thread.start()
        thread.join(THREAD_TIMEOUT)
        assert seen == [default]
    assert current() is default


def test_steps_run_in_the_backend_even_when_resumed_in_other_threads():
    """A generator driven step by step (the vision tower's blocks) from worker threads: each step sees the
    backend, the driver's context never keeps it, and resuming in another context does not fail."""
    backend = Backend(products="integer")

    def steps():
        seen = []
        for _ in range(3):
            seen.append(current().products)
            yield
        return seen

    driven = backend.run_steps(steps())
    resumed = []
    for _ in range(3):
        thread = threading.Thread(target=lambda: resumed.append(next(driven)))
        thread.start()
        thread.join(THREAD_TIMEOUT)
        assert current() is not backend
    with pytest.raises(StopIteration) as done:
        next(driven)
    assert resumed == [None] * 3 and done.value.value == ["integer"] * 3


async def test_serve_refuses_a_setting_that_a_loaded_model_does_not_have():
    model = load_model(GGUF, products="exact")
    with trio.fail_after(60):
        with pytest.raises(ModelLoadError, match="products='integer': the model was loaded with products='exact'"):
            await serve(model, port=0, products="integer")  # raises before anything listens
        threads = model.decoder.backend.thread_count
        with pytest.raises(ModelLoadError, match=f"blas_threads={threads + 1}: the model was loaded with"):
            await serve(model, port=0, blas_threads=threads + 1)


def test_a_checkpoint_loaded_twice_takes_the_first_loads_timed_small_batch_call(monkeypatch):
    """The small-batch calls add in different orders: a second load timing its own (and picking another on a busy
    machine) gave the same folder different logits (1e-6 apart). A sample of the same shapes, dtypes and thread
    count takes the call timed first, whatever a second timing would say."""
    folder = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_bf16_tied"
    monkeypatch.setattr(matmul, "_timed_calls", {})
    answers = iter(["weight_left", "weight_right", "row_blocks", "compiled"])
    timings: list[str] = []

    def timed(backend, weights=None, rounds=3):
        timings.append(next(answers))
        return timings[-1]

    monkeypatch.setattr(matmul, "_time_small_batch_calls", timed)
    first, second = load_model(folder), load_model(folder)
    assert timings == ["weight_left"]  # timed once, on the first load's own weights
    assert first.decoder.backend.small_batch.call == second.decoder.backend.small_batch.call == "weight_left"
    assert np.array_equal(first.logits([1, 5, 9, 42, 7, 300]), second.logits([1, 5, 9, 42, 7, 300]))
