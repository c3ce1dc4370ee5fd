"""Cutting streamed text at the first stop string.

Theory of operation: text arrives in deltas, and a stop string may straddle
them. The matcher keeps a small buffer of text it has not emitted yet. After
each delta it looks for the earliest complete stop string in the buffer and
for the earliest position from which the buffer's tail is still a proper
prefix of some stop string (a stop that may yet complete). A complete match
is final unless a pending prefix starts before it (with stops "bcd" and "c",
"bc" must wait: "bcd" would cut earlier). Everything before the earliest of
the two positions can no longer be part of a stop and is emitted; the rest
stays buffered. The result is therefore independent of how the text was split:
the emitted text is the full text cut before its first stop occurrence. The
buffer never holds more than the longest stop string's length.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["StopStringMatcher"]


class StopStringMatcher:
    """Withholds stop strings (and what follows them) from a text stream.

    Args:
        stops: the stop strings; each must be non-empty.

    Attributes:
        stopped: a stop string has matched; later pushes emit nothing.
        matched: the stop string that matched (the earliest occurrence), or None.
    """

    def __init__(self, stops: Iterable[str]) -> None:
        self._stops = tuple(dict.fromkeys(stops))
        if any(not stop for stop in self._stops):
            raise ValueError("stop strings must be non-empty")
        self._longest = max((len(stop) for stop in self._stops), default=0)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def push(self, text_delta: str) -> tuple[str, bool]:
        """Feed the next piece of text.

        Returns:
            (emit, stopped): the text now known to precede any stop, and whether
            a stop string has completed (then ``emit`` ends just before it).
        """
        if self.stopped:
            return "", True
        buffer = self._held + text_delta
        match = self._first_match(buffer)
        pending = self._first_pending(buffer, before=len(buffer) if match is None else match)
        if match is not None and pending is None:
            self._held, self.stopped = "", True
            self.matched = self._matched_at(buffer, match)
            return buffer[:match], True
        cut = len(buffer) if pending is None else pending
        self._held = buffer[cut:]
        return buffer[:cut], False

    def flush(self) -> str:
        """End of stream: release held text, cut at a stop that completed (sets ``stopped``)."""
        if self.stopped:
            return ""
        buffer, self._held = self._held, ""
        match = self._first_match(buffer)
        if match is None:
            return buffer
        self.stopped = True
        self.matched = self._matched_at(buffer, match)
        return buffer[:match]

    def _first_match(self, buffer: str) -> int | None:
        """Start of the earliest complete stop string in ``buffer``."""
        starts = [i for i in (buffer.find(stop) for stop in self._stops) if i >= 0]
        return min(starts, default=None)

    def _matched_at(self, buffer: str, start: int) -> str:
        """The stop string found at ``start`` (the first listed, when several begin there)."""
        return next(stop for stop in self._stops if buffer.startswith(stop, start))

    def _first_pending(self, buffer: str, *, before: int) -> int | None:
        """Earliest start < ``before`` from which ``buffer``'s tail may still become a stop."""
        for start in range(max(0, len(buffer) - self._longest + 1), before):
            tail = buffer[start:]
            if any(len(stop) > len(tail) and stop.startswith(tail) for stop in self._stops):
                return start
        return None
