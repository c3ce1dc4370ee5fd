"""Download progress: one bar on a terminal, a log line every tenth of the way otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

__all__ = ["DownloadProgress", "format_bytes"]

log = logging.getLogger("kestrel_trio.hub")

_BAR_WIDTH = 30
_LOG_STEP = 0.10  # a log line each time another tenth of the bytes has arrived
_REDRAW_INTERVAL = 0.1  # s between terminal redraws (each chunk would be too often)


def format_bytes(count: int) -> str:
    """``count`` bytes for people: ``512 B``, ``93.8 MiB``, ``1.4 GiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class DownloadProgress:
    """Bytes received of a known total, shown as a bar on a terminal, as log lines otherwise.

    Args:
        label: what is downloading, e.g. the repo id.
        total: bytes expected in all (the files still to fetch).
        stream: where a terminal bar is drawn (stderr).
    """

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(total, 0)
        self.received = 0
        self.stream = stream if stream is not None else sys.stderr
        self.on_terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self._started = time.monotonic()
        self._drawn_at = 0.0
        self._logged_steps = 0
        self._finished = False

    def add(self, count: int) -> None:
        """``count`` more bytes arrived (negative when a resumed download had to start over)."""
        self.received = max(0, self.received + count)
        if self.on_terminal:
            now = time.monotonic()
            if now - self._drawn_at >= _REDRAW_INTERVAL or self.received >= self.total:
                self._drawn_at = now
                self._draw()
        elif self.total:
            steps = int(min(self.received, self.total) / self.total / _LOG_STEP + 1e-9)
            if steps > self._logged_steps:
                self._logged_steps = steps
                log.info("downloading %s: %d%% (%s of %s, %s)", self.label, min(100, steps * 10),
                         format_bytes(self.received), format_bytes(self.total), self._rate())

    def finish(self) -> None:
        """End the bar's line (the log says 100% by itself)."""
        if self.on_terminal and not self._finished:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
        self._finished = True

    def _rate(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-6)
        return f"{format_bytes(int(self.received / elapsed))}/s"

    def _draw(self) -> None:
        fraction = min(self.received / self.total, 1.0) if self.total else 1.0
        filled = int(fraction * _BAR_WIDTH)
        self.stream.write(f"\rdownloading {self.label} [{'#' * filled}{' ' * (_BAR_WIDTH - filled)}] "
                          f"{int(fraction * 100):3d}% {format_bytes(self.received)} of {format_bytes(self.total)} "
                          f"{self._rate()}\x1b[K")
        self.stream.flush()

    def tqdm_class(self) -> Any:
        """A stand-in for tqdm that huggingface_hub's ``tqdm_class`` accepts: each file's bytes feed this bar.

        huggingface_hub builds one per file (``total``, ``initial`` = bytes
        already on disk when resuming) and calls ``update(n)`` per chunk.
        """
        progress = self

        class _FileBar:
            def __init__(self, *args: object, initial: int = 0, **kwargs: object) -> None:
                if initial:
                    progress.add(int(initial))

            def __enter__(self) -> _FileBar:
                return self

            def __exit__(self, *exc_info: object) -> None:
                return None

            def update(self, n: float | None = 1) -> None:
                progress.add(int(n or 0))

            def close(self) -> None:
                return None

        return _FileBar
