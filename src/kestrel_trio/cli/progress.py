"""Weight-load progress for the command line: one reporter for ``serve``, ``generate`` and ``chat``.

On a terminal it draws a one-line bar that redraws in place; anywhere else
(a pipe, a file, a service manager's journal) a redrawn line is noise, so it
logs a line at the start, at most one every ``interval`` seconds while
loading, and one at the end. ``load_model`` calls it with the fraction of
weight bytes read (0 to 1), from a worker thread under ``serve``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import Callable, TextIO

__all__ = ["LoadProgress", "checkpoint_bytes", "is_terminal"]

log = logging.getLogger("kestrel_trio.load")

LOG_INTERVAL = 5.0  # seconds between log lines while a load runs off a terminal


def checkpoint_bytes(folder: str | Path | None, mmproj: str | Path | None = None) -> int | None:
    """Bytes a load reads: the ``*.safetensors`` files in ``folder``, or a GGUF file's size (plus its
    ``mmproj`` file's); None when unknown."""
    if folder is None:
        return None
    try:
        if Path(folder).is_file():
            return Path(folder).stat().st_size + (Path(mmproj).stat().st_size if mmproj is not None else 0) or None
        total = sum(path.stat().st_size for path in Path(folder).rglob("*.safetensors"))
    except OSError:
        return None
    return total or None


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


class LoadProgress:
    """A load's progress: a bar on a terminal, else periodic log lines (percent, bytes, elapsed seconds).

    Args:
        label: what is loading, e.g. "loading weights".
        total_bytes: the bytes the load reads, shown beside the percentage (None: percent only).
        stream: where the bar is drawn.
        interactive: draw a bar (default: whether ``stream`` is a terminal).
        interval: seconds between log lines when not interactive.
        clock: a monotonic clock in seconds (tests pass their own).
        bar_width: characters of the bar.
    """

    def __init__(
        self, label: str, *, total_bytes: int | None = None, stream: TextIO | None = None,
        interactive: bool | None = None, interval: float = LOG_INTERVAL,
        clock: Callable[[], float] = time.monotonic, bar_width: int = 30,
    ) -> None:
        self.label = label
        self.total_bytes = total_bytes
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = is_terminal(self.stream) if interactive is None else interactive
        self.interval = interval
        self.clock = clock
        self.bar_width = bar_width
        self._lock = threading.Lock()  # calls come from a loader thread; close() from the main one
        self._started: float | None = None
        self._last_line: float | None = None
        self._shown_percent = -1
        self._line_open = False  # a bar is drawn and its line not yet ended
        self._drawn = 0  # characters of the longest bar line drawn
        self._finished = False

    def __call__(self, fraction: float) -> None:
        """Report that ``fraction`` (0 to 1) of the load is done."""
        fraction = min(1.0, max(0.0, fraction))
        with self._lock:
            if self._finished:
                return
            now = self.clock()
            if self._started is None:
                self._started = now
            done = fraction >= 1.0
            if self.interactive:
                self._draw(fraction, now, done)
            elif done or self._last_line is None or now - self._last_line >= self.interval:
                self._log(fraction, now, done)
            self._finished = done

    def close(self) -> None:
        """End a bar left unfinished (a failed load), so the next line starts on its own."""
        with self._lock:
            if self._line_open:
                self.stream.write("\n")
                self.stream.flush()
                self._line_open = False
            self._finished = True

    def _amount(self, fraction: float) -> str:
        if self.total_bytes is None:
            return ""
        return f"{_size(fraction * self.total_bytes)} of {_size(self.total_bytes)}"

    def _draw(self, fraction: float, now: float, done: bool) -> None:
        percent = int(fraction * 100)
        if percent == self._shown_percent and not done:
            return
        self._shown_percent = percent
        filled = int(fraction * self.bar_width)
        amount = self._amount(fraction)
        line = (f"{self.label} [{'#' * filled}{' ' * (self.bar_width - filled)}] {percent:3d}%"
                f"{'  ' + amount if amount else ''}  {now - self._started:.1f} s")
        self._drawn = max(self._drawn, len(line))  # pad: a shorter line must cover the longer one before it
        self.stream.write("\r" + line.ljust(self._drawn))
        self._line_open = not done
        if done:
            self.stream.write("\n")
        self.stream.flush()

    def _log(self, fraction: float, now: float, done: bool) -> None:
        self._last_line = now
        amount = self._amount(fraction)
        elapsed = now - self._started
        if done:
            log.info("%s: 100%%%s in %.1f s", self.label, f" ({_size(self.total_bytes)})" if amount else "", elapsed)
        else:
            log.info("%s: %d%%%s after %.1f s", self.label, int(fraction * 100), f" ({amount})" if amount else "",
                     elapsed)


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (False for pipes, files, closed streams and stand-ins without isatty)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
