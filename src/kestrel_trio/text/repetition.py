"""The repetition guard: ending a generation that has fallen into a loop.

Theory of operation: a small model (and a greedy or low-temperature one of any
size) can fall into a cycle, the same line or stanza again and again until its
token cap. A :class:`RepetitionGuard` ``(window, repeats)`` ends the generation
once its last ``window`` tokens are one cycle of at most ``window // repeats``
tokens repeated back to back: at least ``repeats`` copies, the oldest of which
may be cut at the window's start. Judging a whole window, not a count of copies
alone, keeps short cycles that are ordinary text ("ha ha ha", a run of ``-`` in
a table) from ending an answer: a one-token cycle must fill the whole window.

:class:`RepetitionWatch` checks this incrementally, in O(window / repeats) per
token: for every cycle length ``p`` it keeps how many of the latest tokens each
equal the token ``p`` before them. The last ``window`` tokens repeat a cycle of
length ``p`` exactly when that count reaches ``window - p``.
"""

from __future__ import annotations

from typing import Any

import attrs

from kestrel_trio.errors import BadRequestError

__all__ = ["RepetitionGuard", "RepetitionWatch", "MAX_GUARD_WINDOW"]

MAX_GUARD_WINDOW = 4096  # tokens; each generated token costs window // repeats comparisons


def _check_guard(instance: RepetitionGuard, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"repetition_guard.{attribute.name} must be an integer, got {value!r}",
                              param=f"repetition_guard.{attribute.name}")


@attrs.frozen
class RepetitionGuard:
    """End a generation when its last ``window`` tokens are ``repeats`` or more copies of one cycle.

    Attributes:
        window: tokens judged, 2 to :data:`MAX_GUARD_WINDOW`.
        repeats: the fewest copies of the cycle in the window, 2 to ``window``; the longest cycle
            caught is ``window // repeats`` tokens.

    Raises:
        BadRequestError: a value is not an integer or out of range; ``param`` names it.
    """

    window: int = attrs.field(validator=_check_guard)
    repeats: int = attrs.field(validator=_check_guard)

    def __attrs_post_init__(self) -> None:
        if not 2 <= self.window <= MAX_GUARD_WINDOW:
            raise BadRequestError(f"repetition_guard.window must be from 2 to {MAX_GUARD_WINDOW} tokens, "
                                  f"got {self.window}", param="repetition_guard.window")
        if not 2 <= self.repeats <= self.window:
            raise BadRequestError(f"repetition_guard.repeats must be from 2 to the window ({self.window}), "
                                  f"got {self.repeats}", param="repetition_guard.repeats")

    @property
    def longest_cycle(self) -> int:
        """The longest cycle caught, in tokens."""
        return self.window // self.repeats

    def describe(self) -> str:
        """``WINDOW:REPEATS``, the form ``--repetition-guard`` and chat's ``/set`` take."""
        return f"{self.window}:{self.repeats}"

    @classmethod
    def parse(cls, text: str) -> RepetitionGuard:
        """A guard from ``WINDOW:REPEATS`` (e.g. ``128:4``).

        Raises:
            BadRequestError: not two integers joined by ``:``, or out of range.
        """
        window, colon, repeats = text.strip().partition(":")
        try:
            return cls(int(window), int(repeats))
        except ValueError:
            raise BadRequestError(f"a repetition guard is WINDOW:REPEATS, two integers such as 128:4; got {text!r}",
                                  param="repetition_guard") from None


class RepetitionWatch:
    """One generation's repetition guard, fed each token as it is generated.

    Args:
        guard: the window and repeats.
    """

    def __init__(self, guard: RepetitionGuard) -> None:
        self.guard = guard
        self._tokens: list[int] = []  # the last longest_cycle tokens, oldest first
        self._runs = [0] * (guard.longest_cycle + 1)  # [p]: latest tokens equal to the one p before, in a row

    def push(self, token: int) -> bool:
        """Take the next generated token; True once the last ``window`` tokens repeat one cycle."""
        tokens, runs, window = self._tokens, self._runs, self.guard.window
        looping = False
        for p in range(1, min(len(tokens), len(runs) - 1) + 1):
            if tokens[-p] == token:
                runs[p] += 1
                looping = looping or runs[p] >= window - p
            else:
                runs[p] = 0
        tokens.append(token)
        if len(tokens) > len(runs) - 1:
            del tokens[0]
        return looping
