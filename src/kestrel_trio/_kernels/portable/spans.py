"""Work over spans of items, each span a task of a runner: how a wrapper shares one loop among product threads.

Plain Python (no numba): the runner is the model's product threads (a callable
that runs a list of tasks, the caller taking the first), or None for one thread.
"""

from __future__ import annotations

from typing import Callable


def run_spans(work: Callable[[int, int], None], items: int, run: Callable[[list[Callable[[], None]]], None] | None,
               shares: Callable[[int], list[tuple[int, int]]] | None) -> None:
    """``work(first, stop)`` over ``shares(items)``, each span a task of ``run`` (the caller taking the last, as it
    starts at once); over all items on this thread where ``run`` is None or there is one span."""
    spans = [(a, b) for a, b in shares(items) if b > a] if shares is not None else [(0, items)]
    if run is None or len(spans) < 2:
        work(0, items)
        return
    tasks = [(lambda a=a, b=b: work(a, b)) for a, b in spans]
    run([tasks[-1]] + tasks[:-1])
