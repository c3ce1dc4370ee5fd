"""The product threads: the caller plus helpers that share one weight product, each multiplying a stretch of it.

numpy's BLAS and its upcast ufuncs release the GIL, so the threads run on separate cores. One pool per count a
model was loaded with (kestrel_trio._model.products.backend.Backend.threads); kestrel_trio._model.products.matmul
decides what to share.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import weakref
from collections.abc import Callable, Iterator

__all__ = ["ProductThreads"]

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
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        for k in range(count - 1):
            threading.Thread(target=_serve, args=(self._jobs,), name=f"kestrel-product-{k + 1}", daemon=True).start()
        self._stop = weakref.finalize(self, _stop, self._jobs, count - 1)

    def run(self, tasks: list[Callable[[], None]], blas: bool = True) -> None:
        """Run ``tasks[1:]`` on the helpers and ``tasks[0]`` here, with one-thread BLAS; raise the first error.
        ``blas`` False: the tasks call no BLAS (compiled integer products), so its thread count is left alone
        (the switch there and back costs a few microseconds, a hundred times a decode step)."""
        done: queue.SimpleQueue = queue.SimpleQueue()  # per call: forward may run in several threads at once
        with self.one_thread_blas() if blas else contextlib.nullcontext():
            for task in tasks[1:]:
                self._jobs.put((task, done))
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


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        task, done = job
        try:
            task()
        except BaseException as error:  # handed to the caller, who raises it
            done.put(error)
        else:
            done.put(None)


def _stop(jobs: queue.SimpleQueue, helpers: int) -> None:
    for _ in range(helpers):
        jobs.put(None)
