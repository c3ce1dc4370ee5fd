"""The product threads: the caller plus helpers that share one weight product, each multiplying a stretch of it.

numpy's BLAS and its upcast ufuncs release the GIL, so the threads run on separate cores. One pool per count a
model was loaded with (kestrel_trio._model.products.backend.Backend.threads); kestrel_trio._model.products.matmul
decides what to share.

Two ways to hand a helper work: a Python task through its queue (:meth:`ProductThreads.run`: any work, a
thread's wake-up each, tens of microseconds), and compiled integer products as job rows
(:meth:`ProductThreads.run_jobs`, kestrel_trio._kernels.portable.handoff: a helper waiting in compiled code takes them
in well under a microsecond). Each helper waits in compiled code while it has had such jobs lately (SPIN_SECONDS),
then sleeps on its queue; Python work sent to it asks it back first.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import numpy as np

__all__ = ["ProductThreads", "SPIN_SECONDS", "LATE_SECONDS", "LATE_SHARE", "BACKOFF_FIRST", "BACKOFF_MOST"]

# How long a helper waits for compiled jobs in compiled code (a core kept busy) before it sleeps: longer than
# the gap between two tokens' steps when the engine streams (1-2 ms of engine and HTTP work), so it stays
# awake while a sequence decodes; an idle server's helpers sleep after this.
SPIN_SECONDS = 0.005
# A caller that waited for a helper's last chunk at least LATE_SECONDS and most (LATE_SHARE) of its call: the
# helper was kept off its core (by another process's time slice, a page fault in the mapped weights, the VM's
# host). A helper merely late to start (back from Python work) makes its caller wait well under a millisecond
# (at most a chunk: 0.2-0.4 ms at 8 activation rows under AVX2). The next tables then run on the caller alone,
# BACKOFF_FIRST of them after one late helper, twice as many after each late one since the pool last shared a
# table in time, at most BACKOFF_MOST (a Qwen3-0.6B token is about 113 tables): a stray stall costs a few
# tables, a busy machine mostly runs alone and tries the helpers now and then (kestrel_trio._kernels.portable.handoff).
LATE_SECONDS = 0.001
LATE_SHARE = 0.75
BACKOFF_FIRST = 16
BACKOFF_MOST = 512
_WAKE = object()  # a sleeping helper's wake-up: compiled jobs were run without it

# One-thread BLAS windows open (nested, from several forward threads, or from two models' pools at once): numpy's
# BLAS thread count is one per process, so it goes back to a pool's count only when the last window closes.
_windows = [0]
_window_lock = threading.Lock()


class ProductThreads:
    """The caller plus ``count - 1`` daemon helpers; :meth:`run` runs one task on each and waits for all.

    A job queue of C-implemented SimpleQueues: a hand-off costs tens of
    microseconds (a thread wake-up), where a ThreadPoolExecutor costs more.
    The helpers hold the queue, not the pool: once no backend holds the pool
    (its models gone, the defaults replaced) they are stopped.
    """

    def __init__(self, count: int, set_blas_threads: Callable[[int], None] | None = None) -> None:
        self.count = count
        self._set_blas_threads = set_blas_threads
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(count - 1)]
        self._handoff = _handoff()
        # The helpers' control lines (kestrel_trio._kernels.portable.handoff), None where numba is missing.
        self._ctrl = None if self._handoff is None else np.zeros(count * self._handoff.LINE, dtype=np.int64)
        rate = _rounds_a_second(self._handoff) if self._handoff is not None else 0.0  # of a compiled wait
        spins = max(1000, int(rate * SPIN_SECONDS))  # idle rounds before a helper sleeps
        self._late = int(rate * LATE_SECONDS)  # rounds of waiting for a helper that count as late
        self._round_seconds = 1.0 / rate if rate else 0.0
        self._backoffs = 0  # times a late helper sent the callers alone
        self._late_streak = 0  # late helpers since a table was last shared in time
        helpers = [threading.Thread(target=_serve, args=(jobs, self._handoff, self._ctrl, k, spins),
                                    name=f"kestrel-product-{k + 1}", daemon=True)
                   for k, jobs in enumerate(self._queues)]
        self._helpers = helpers
        for helper in helpers:
            helper.start()
        # Also called at exit (a finalizer's default): helpers leave compiled code before the interpreter goes.
        self._stop = weakref.finalize(self, _stop, self._queues, self._handoff, self._ctrl, helpers)

    @property
    def takes_jobs(self) -> bool:
        """Whether :meth:`run_jobs` can hand compiled jobs to the helpers (numba is here)."""
        return self._ctrl is not None

    def backoffs(self) -> int:
        """How many times a late helper sent this pool's callers to run tables alone for a while."""
        return self._backoffs

    def run_jobs(self, jobs: np.ndarray) -> None:
        """Run the compiled job rows ``jobs`` (int64 [chunks, FIELDS], kestrel_trio._kernels.portable.handoff), the
        helpers taking chunks too where they are awake and free; return when all are done."""
        ctrl = self._ctrl
        shared = ctrl[self._handoff.ALONE] == 0  # (else this table runs alone, counting ALONE down)
        started = time.perf_counter()
        asleep, waited = self._handoff.run_shared(ctrl, jobs)
        if waited > self._late and waited * self._round_seconds > LATE_SHARE * (time.perf_counter() - started):
            ctrl[self._handoff.ALONE] = min(BACKOFF_MOST, BACKOFF_FIRST << self._late_streak)  # alone a while
            self._late_streak = min(self._late_streak + 1, 16)
            self._backoffs += 1
        elif shared:
            self._late_streak = 0
        while asleep:  # woken: back in compiled code for the next jobs
            helper = asleep.bit_length() - 1
            self._queues[helper].put(_WAKE)
            asleep &= ~(1 << helper)

    def run(self, tasks: list[Callable[[], None]], blas: bool = True) -> None:
        """Run ``tasks[1:]`` on the helpers and ``tasks[0]`` here, with one-thread BLAS; raise the first error.
        ``blas`` False: the tasks call no BLAS (compiled integer products), so its thread count is left alone
        (the switch there and back costs a few microseconds, a hundred times a decode step)."""
        done: queue.SimpleQueue = queue.SimpleQueue()  # per call: forward may run in several threads at once
        with self.one_thread_blas() if blas else contextlib.nullcontext():
            for k, task in enumerate(tasks[1:]):
                self._queues[k].put((task, done))
                if self._ctrl is not None:
                    self._handoff.nudge(self._ctrl, k)  # back from compiled code to its queue
            errors = []
            try:
                tasks[0]()
            except BaseException as error:
                errors.append(error)
            errors += [e for e in (done.get() for _ in tasks[1:]) if e is not None]
        if errors:
            raise errors[0]

    @contextlib.contextmanager
    def one_thread_blas(self) -> Iterator[None]:
        """numpy's BLAS on one thread (process-wide) inside, ``count`` after: these threads are its callers.

        After the last window open in the process closes (another model's pool may have one open meanwhile).

        The setter must work from any thread: the engine steps in a worker
        thread, where OpenBLAS's ``openblas_set_num_threads`` leaves the count
        as it was (measured: every shared product of a batched step then ran
        OpenBLAS's threaded GEMM, the threads' calls queueing on its one
        lock: 298 ms a Qwen3-0.6B 8-row step under the Haswell kernel,
        against 194 ms from the main thread). kestrel_trio.model passes
        ``openblas_set_num_threads_local``, which does work from any thread.
        """
        if self._set_blas_threads is None:
            yield
            return
        with _window_lock:
            _windows[0] += 1
            if _windows[0] == 1:
                self._set_blas_threads(1)  # a C call, about a microsecond
        try:
            yield
        finally:
            with _window_lock:
                _windows[0] -= 1
                if _windows[0] == 0:
                    self._set_blas_threads(self.count)

    def stop(self) -> None:
        """Stop the helpers now (a pool no backend uses any more; later :meth:`run` calls would wait forever)."""
        self._stop()


def _serve(jobs: queue.SimpleQueue, handoff, ctrl: np.ndarray | None, k: int, spins: int) -> None:
    """Helper ``k``: compiled jobs while they come (``handoff.serve``), else Python tasks from its queue."""
    while True:
        if ctrl is not None and jobs.empty():
            handoff.wake_up(ctrl, k)
            if handoff.serve(ctrl, k, spins) == handoff.STOPPED:
                return
        job = jobs.get()
        if job is None:
            return
        if job is _WAKE:
            continue
        task, done = job
        try:
            task()
        except BaseException as error:  # handed to the caller, who raises it
            done.put(error)
        else:
            done.put(None)


def _stop(queues: list[queue.SimpleQueue], handoff, ctrl: np.ndarray | None, helpers: list[threading.Thread]) -> None:
    for k, jobs in enumerate(queues):
        if ctrl is not None:
            handoff.stop(ctrl, k)
        jobs.put(None)
    for helper in helpers:
        if helper is not threading.current_thread():
            helper.join(timeout=1.0)  # named: a helper inside a long task is left to finish as a daemon


def _handoff():
    """kestrel_trio._kernels.portable.handoff where its compiled code loads here, else None (Python tasks only)."""
    from kestrel_trio import _kernels

    if not _kernels.ready():
        return None
    from kestrel_trio._kernels.portable import handoff

    return handoff


_rate: list[float] = []  # rounds a second of a compiled wait here, timed once a process


def _rounds_a_second(handoff) -> float:
    """The rounds of a compiled wait (a load and a pause: ``handoff.spin_rounds``) a second on this CPU."""
    if not _rate:
        handoff.spin_rounds(1000)  # compiled, or loaded from numba's cache
        rounds, started = 200_000, time.perf_counter()
        handoff.spin_rounds(rounds)
        _rate.append(rounds / max(time.perf_counter() - started, 1e-6))
    return _rate[0]
