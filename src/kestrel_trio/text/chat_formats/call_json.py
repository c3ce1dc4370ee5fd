"""Reading a tool call's JSON as it is written: the head up to the arguments, then where the arguments end.

The body of a Qwen tool call is one JSON object, ``{"name": "...", "arguments": {...}}``. To stream the
arguments while they are decoded, the parser needs two things of a text that is still growing:

* :func:`match_head`: whether the text so far is (or could still become) that object's head,
  ``{"name": <string>, "arguments": {`` with any JSON whitespace between the tokens (``"parameters"`` is
  accepted for ``"arguments"``); once it is, the name and where the arguments object starts;
* :class:`ObjectEnd`: fed the arguments' text piece by piece, where the object closes (its braces and
  brackets counted outside strings, escapes skipped), so the text after it is not sent as arguments.

Neither decodes the arguments: they are sent as the model wrote them, which is what OpenAI sends too.
"""

from __future__ import annotations

import json

import attrs

__all__ = ["Head", "PARTIAL", "MISMATCH", "match_head", "ObjectEnd"]

PARTIAL = "partial"  # the text could still grow into a head
MISMATCH = "mismatch"  # it never will: the call is read whole at its end instead
_WHITESPACE = " \t\n\r"
_ARGUMENT_KEYS = ('"arguments"', '"parameters"')


@attrs.frozen
class Head:
    """A complete head: the function's name and the index of the arguments' opening ``{`` in the text."""

    name: str
    arguments_at: int


def match_head(text: str) -> Head | str:
    """The :class:`Head` of ``text``, or :data:`PARTIAL` / :data:`MISMATCH` (see module doc)."""
    i = _skip(text, 0)
    for expected in ("{", '"name"', ":"):
        i = _literal(text, i, (expected,))
        if isinstance(i, str):
            return i
    if i == len(text):
        return PARTIAL
    if text[i] != '"':
        return MISMATCH
    end = _string_end(text, i)
    if end is None:
        return PARTIAL
    try:
        name = json.loads(text[i:end])
    except ValueError:
        return MISMATCH
    if not name:
        return MISMATCH
    i = _skip(text, end)
    for expected in ((",",), _ARGUMENT_KEYS, (":",)):
        i = _literal(text, i, expected)
        if isinstance(i, str):
            return i
    if i == len(text):
        return PARTIAL
    return Head(name, i) if text[i] == "{" else MISMATCH


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def _literal(text: str, i: int, choices: tuple[str, ...]) -> int | str:
    """The index after one of ``choices`` at ``i`` and the whitespace after it, or PARTIAL / MISMATCH."""
    rest = text[i:]
    for literal in choices:
        if rest.startswith(literal):
            return _skip(text, i + len(literal))
    return PARTIAL if any(literal.startswith(rest) for literal in choices) else MISMATCH


def _string_end(text: str, i: int) -> int | None:
    """The index after the JSON string opening at ``text[i]``, or None if it is not closed yet."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == '"':
            return j + 1
        j += 1
    return None


@attrs.define
class ObjectEnd:
    """Where a JSON object fed in pieces closes (the first piece starts with its ``{``)."""

    _depth: int = attrs.field(init=False, default=0)
    _in_string: bool = attrs.field(init=False, default=False)
    _escaped: bool = attrs.field(init=False, default=False)
    closed: bool = attrs.field(init=False, default=False)

    def feed(self, piece: str) -> int:
        """How many characters of ``piece`` belong to the object (all of it while it stays open)."""
        for k, char in enumerate(piece):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.closed = True
                    return k + 1
        return len(piece)
