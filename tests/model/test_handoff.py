"""The compiled hand-off (kestrel_trio._kernels.portable.handoff) and the product threads that use it: job tables shared
between threads give each kernel's own results bit for bit, with helpers awake, asleep, busy with another caller,
or asked back for Python work; the protocol's answers checked step by step without any helper thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kestrel_trio import _kernels

pytestmark = pytest.mark.skipif(not _kernels.ready(), reason=_kernels.unavailable_reason())

if _kernels.ready():
    from kestrel_trio._kernels.portable import handoff
    from kestrel_trio._kernels.arm import integer as arm
    from kestrel_trio._kernels.plan import this_plan
    from kestrel_trio._model.products.product_threads import ProductThreads

from test_integer_products import FORMS, block_rows, quantized, sums_of  # noqa: E402

JOIN_SECONDS = 60.0  # how long a test waits for a thread that should end at once (a hang fails, not a slow host)

# The kernels with a job entry: (module, kernel name, the plan's variant that must run here); the widening NEON
# kernel is plain vector IR that any CPU runs.
ENTRIES = [("arm.integer", "product_widening", None), ("arm.integer", "product_sdot", "neon-dotprod"),
           ("x86.integer", "product_avx2", "avx2"), ("x86.integer", "product_vnni256", "avx-vnni"),
           ("x86.integer", "product_vnni512", "avx512-vnni")]


def _runnable() -> list:
    """The job entries this host executes, the others skipped with the reason (host_cpu)."""
    runnable = this_plan().integer.runnable if _kernels.ready() else ()
    return [pytest.param(module, name, marks=[pytest.mark.host_cpu, pytest.mark.skipif(
        variant is not None and variant not in runnable, reason=f"this host cannot run {variant}")])
        for module, name, variant in ENTRIES]


def _table(module: str, name: str, form: str, data, xq, xd, xs, out, chunk: int) -> np.ndarray:
    """Job rows (int64 [chunks, FIELDS]) of ``name`` over all of ``data``'s rows into ``out`` [1, rows]."""
    import importlib

    kernels = importlib.import_module(f"kestrel_trio._kernels.{module}")
    entry, form_id = kernels.job_entry(name), kernels.form_id(form)
    rows = []
    for start in range(0, data.shape[0], chunk):
        stop = min(start + chunk, data.shape[0])
        row = np.zeros(handoff.FIELDS, dtype=np.int64)
        row[:14] = (entry, form_id, data.ctypes.data, data.shape[0], data.shape[1], xq.ctypes.data, xq.shape[1],
                    xd.ctypes.data, xs.ctypes.data, xq.shape[0], start, stop, out[:, start:].ctypes.data,
                    out.strides[0] // 4)
        rows.append(row)
    return np.stack(rows)


def _case(form: str, seed: int, rows: int = 200, cols: int = 512, n: int = 1):
    rng = np.random.default_rng(seed)
    data = block_rows(form, rng, rows, cols)  # [rows, row_bytes]
    xq, xd = quantized(rng.standard_normal((n, cols), dtype=np.float32))  # [n, cols], [n, cols/32]
    return data, xq, xd, sums_of(xq, xd)


def _kernel(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(f"kestrel_trio._kernels.{module}"), name)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("module", "name"), _runnable())
@pytest.mark.parametrize("n", [1, 5])
def test_a_shared_job_table_is_the_kernel_s_own_product_bit_for_bit(module, name, form, n):
    """One activation row (a decode step) or several (a batch), into a column range of a wider output."""
    data, xq, xd, xs = _case(form, 3, n=n)
    want = np.empty((n, data.shape[0]), dtype=np.float32)  # [n, rows]
    _kernel(module, name)(_kernel(module, "form_id")(form), data, xq, xd, xs, 0, data.shape[0], want)
    for threads in (2, 3):
        pool = ProductThreads(threads)
        try:
            for chunk in (8, 24, 64, 200):  # chunks of whole kernel passes, a tail, one chunk for all
                wide = np.full((n, data.shape[0] + 2), np.nan, dtype=np.float32)  # [n, rows + 2]
                out = wide[:, 1:-1]  # [n, rows]: one column either side untouched
                pool.run_jobs(_table(module, name, form, data, xq, xd, xs, out, chunk))
                np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
                assert np.isnan(wide[:, 0]).all() and np.isnan(wide[:, -1]).all()
        finally:
            pool.stop()


def _raw(helpers: int) -> np.ndarray:
    return np.zeros((1 + helpers) * handoff.LINE, dtype=np.int64)  # the pool's line, then each helper's


def _state(ctrl, h: int) -> int:
    return int(ctrl[(1 + h) * handoff.LINE])


def test_without_a_helper_thread_the_caller_runs_every_chunk_and_owes_a_sleeper_one_wake_up():
    data, xq, xd, xs = _case("Q8_0", 5)
    want = np.empty((1, data.shape[0]), dtype=np.float32)
    arm.product_widening(arm.form_id("Q8_0"), data, xq, xd, xs, 0, data.shape[0], want)
    out = np.full((1, data.shape[0]), np.nan, dtype=np.float32)
    table = _table("arm.integer", "product_widening", "Q8_0", data, xq, xd, xs, out, 16)
    ctrl = _raw(2)
    # helper 0 idle but never running (posted, then taken back), helper 1 asleep (owed a wake-up, once)
    ctrl[2 * handoff.LINE] = 4  # ASLEEP
    assert handoff.run_shared(ctrl, table) == (0b10, 0)  # nobody waited for
    np.testing.assert_array_equal(out, want)
    assert _state(ctrl, 0) == 0 and _state(ctrl, 1) == 4 and ctrl[0] == 0  # IDLE, still ASLEEP, pool free
    out[:] = np.nan
    assert handoff.run_shared(ctrl, table)[0] == 0  # the wake-up is owed already
    np.testing.assert_array_equal(out, want)
    handoff.wake_up(ctrl, 1)
    assert _state(ctrl, 1) == 0 and ctrl[2 * handoff.LINE + 1] == 0  # IDLE, owed nothing
    ctrl[0] = 1  # another caller holds the pool: this one runs its table alone, posting nothing
    out[:] = np.nan
    assert handoff.run_shared(ctrl, table) == (0, 0) and _state(ctrl, 0) == 0
    np.testing.assert_array_equal(out, want)


def test_a_stopped_or_yielding_helper_leaves_its_compiled_wait():
    ctrl = _raw(1)
    handoff.nudge(ctrl, 0)
    assert handoff.serve(ctrl, 0, 10**9) == handoff.YIELDED and _state(ctrl, 0) == 4  # ASLEEP, in Python
    handoff.wake_up(ctrl, 0)
    assert handoff.serve(ctrl, 0, 100) == handoff.SLEPT and _state(ctrl, 0) == 4  # nothing came: asleep
    handoff.wake_up(ctrl, 0)
    handoff.stop(ctrl, 0)
    assert handoff.serve(ctrl, 0, 10**9) == handoff.STOPPED


def test_several_callers_python_tasks_and_sleeps_between_them_all_get_their_results():
    """Four threads share one pool's helper (one holds it, the others run alone); Python tasks between the job
    tables ask the helper back from its compiled wait; a pool whose helper slept is woken by the next table."""
    pool = ProductThreads(2)
    cases = [_case(form, 11 + k) for k, form in enumerate(("Q8_0", "Q4_K", "Q6_K", "Q4_0"))]
    failures = []

    def caller(k: int) -> None:
        data, xq, xd, xs = cases[k]
        form = ("Q8_0", "Q4_K", "Q6_K", "Q4_0")[k]
        want = np.empty((1, data.shape[0]), dtype=np.float32)
        arm.product_widening(arm.form_id(form), data, xq, xd, xs, 0, data.shape[0], want)
        out = np.empty_like(want)
        table = _table("arm.integer", "product_widening", form, data, xq, xd, xs, out, 16)
        for round_ in range(30):
            out[:] = np.nan
            pool.run_jobs(table)
            if not np.array_equal(out, want):
                failures.append((k, round_, "jobs"))
            if round_ % 7 == 0:  # a Python task for the helper
                box = []
                pool.run([lambda: box.append(1), lambda: box.append(2)], blas=False)
                if sorted(box) != [1, 2]:
                    failures.append((k, round_, "tasks"))

    try:
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_SECONDS)
        assert not any(thread.is_alive() for thread in threads), "a caller hung"
        assert failures == []
    finally:
        pool.stop()
    assert not any(helper.is_alive() for helper in pool._helpers)  # stop() joined them


def test_a_helper_asleep_is_woken_by_the_next_table(monkeypatch):
    from kestrel_trio._model.products import product_threads

    monkeypatch.setattr(product_threads, "SPIN_SECONDS", 0.0)  # the fewest idle rounds before it sleeps
    pool = ProductThreads(2)
    try:
        data, xq, xd, xs = _case("Q4_0", 17)
        want = np.empty((1, data.shape[0]), dtype=np.float32)
        arm.product_widening(arm.form_id("Q4_0"), data, xq, xd, xs, 0, data.shape[0], want)
        out = np.empty_like(want)
        table = _table("arm.integer", "product_widening", "Q4_0", data, xq, xd, xs, out, 16)
        _until(lambda: _state(pool._ctrl, 0) == 4, "the idle helper to sleep")
        pool.run_jobs(table)  # finds it asleep: runs every chunk, owes it a wake-up and sends it
        np.testing.assert_array_equal(out, want)
        _until(lambda: pool._ctrl[handoff.LINE + 1] == 0, "the helper to take its wake-up")  # WAKE cleared
    finally:
        pool.stop()


def _until(condition, what: str) -> None:
    """Wait for ``condition`` (polled each millisecond) at most JOIN_SECONDS; fail naming ``what``."""
    import time

    for _ in range(int(JOIN_SECONDS * 1000)):
        if condition():
            return
        time.sleep(0.001)
    pytest.fail(f"waited {JOIN_SECONDS} s for {what}")


def test_while_alone_counts_down_tables_run_without_posting_to_any_helper():
    data, xq, xd, xs = _case("Q8_0", 23)
    want = np.empty((1, data.shape[0]), dtype=np.float32)
    arm.product_widening(arm.form_id("Q8_0"), data, xq, xd, xs, 0, data.shape[0], want)
    out = np.full_like(want, np.nan)
    table = _table("arm.integer", "product_widening", "Q8_0", data, xq, xd, xs, out, 16)
    ctrl = _raw(1)
    ctrl[handoff.ALONE] = 2
    ctrl[handoff.LINE] = 4  # the helper asleep: posting to it would owe it a wake-up
    for left in (1, 0):
        out[:] = np.nan
        assert handoff.run_shared(ctrl, table) == (0, 0) and ctrl[handoff.ALONE] == left
        np.testing.assert_array_equal(out, want)
    assert ctrl[handoff.LINE + 1] == 0  # owed nothing while alone
    assert handoff.run_shared(ctrl, table)[0] == 1  # then the helpers again: the sleeper is owed a wake-up


def test_a_helper_that_keeps_its_caller_waiting_sends_the_pool_alone_for_a_while(monkeypatch):
    """A wait for a helper's last chunk that is most of the call (the helper kept off its core) sends the next
    tables to the caller alone, BACKOFF_FIRST of them, twice as many while helpers keep being late; a short wait
    does not."""
    from kestrel_trio._model.products import product_threads

    pool = ProductThreads(2)
    try:
        data, xq, xd, xs = _case("Q8_0", 29)
        out = np.empty((1, data.shape[0]), dtype=np.float32)
        table = _table("arm.integer", "product_widening", "Q8_0", data, xq, xd, xs, out, 16)
        real = handoff.run_shared
        monkeypatch.setattr(pool._handoff, "run_shared", lambda ctrl, jobs: (real(ctrl, jobs)[0], pool._late // 2))
        pool.run_jobs(table)
        assert pool.backoffs() == 0 and pool._ctrl[handoff.ALONE] == 0  # under LATE_SECONDS

        def late(ctrl, jobs):
            import time

            started = time.perf_counter()
            asleep, _ = real(ctrl, jobs)
            time.sleep(0.01)  # a helper kept off its core: the call's time, all of it reported as the wait
            return asleep, int((time.perf_counter() - started) / pool._round_seconds)

        monkeypatch.setattr(pool._handoff, "run_shared", late)
        pool.run_jobs(table)
        first = product_threads.BACKOFF_FIRST
        assert pool.backoffs() == 1 and pool._ctrl[handoff.ALONE] == first
        pool._ctrl[handoff.ALONE] = 0
        pool.run_jobs(table)  # late again before any table was shared in time: twice as long
        assert pool.backoffs() == 2 and pool._ctrl[handoff.ALONE] == 2 * first
        pool._ctrl[handoff.ALONE] = 0
        monkeypatch.setattr(pool._handoff, "run_shared", lambda ctrl, jobs: (real(ctrl, jobs)[0], 0))
        pool.run_jobs(table)  # shared in time
        monkeypatch.setattr(pool._handoff, "run_shared", late)
        pool.run_jobs(table)
        assert pool.backoffs() == 3 and pool._ctrl[handoff.ALONE] == first  # back to the first length
    finally:
        monkeypatch.undo()
        pool.stop()
