"""Splitting Qwen3 output into ``reasoning_content`` and ``content``.

Theory of operation (a sans-IO state machine fed decoded text deltas):

* The splitter is in one of two modes, *reasoning* or *content*. It starts in
  reasoning mode when the prompt already opened the block (the template ended
  with ``<think>\\n``), else in content mode.
* ``<think>`` switches to reasoning mode and ``</think>`` to content mode. The
  tags never reach either output; a tag that does not change the mode (a
  stray ``</think>`` in content, a nested ``<think>``) is dropped as well.
* Newline framing is removed the way Qwen's own chat template removes it when
  it renders a past answer: exactly one ``"\\n"`` right after ``<think>`` and
  every ``"\\n"`` right after ``</think>``. (vLLM's Qwen3ReasoningParser strips
  no newlines at all; pass ``strip_newlines=False`` to match it byte for byte.)
* A delta may end inside a tag (``"...</th"``): the longest suffix that could
  still grow into a tag is held back until the next delta or :meth:`flush`, so
  streaming output never depends on how the text was cut into deltas.
* Output that never closes the block stays reasoning: a truncated generation
  (``finish_reason == "length"``) reports what it reasoned, and no content.
"""

from __future__ import annotations

import attrs

__all__ = ["ReasoningSplitter", "split_reasoning", "THINK_START", "THINK_END"]

THINK_START = "<think>"
THINK_END = "</think>"
_TAGS = (THINK_START, THINK_END)
_MAX_PARTIAL = max(len(tag) for tag in _TAGS) - 1

# What to strip from the start of the text that follows a tag.
_STRIP_NONE = 0
_STRIP_ONE_NEWLINE = 1
_STRIP_ALL_NEWLINES = 2


@attrs.define
class ReasoningSplitter:
    """Streaming splitter of ``<think>...</think>`` output.

    Args:
        start_in_reasoning: the prompt ended inside an open ``<think>`` block.
        strip_newlines: strip the newline framing around the tags (see module doc).
    """

    start_in_reasoning: bool
    strip_newlines: bool = True
    _in_reasoning: bool = attrs.field(init=False)
    _pending: str = attrs.field(init=False, default="")
    _strip: int = attrs.field(init=False, default=_STRIP_NONE)
    _saw_reasoning: bool = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._in_reasoning = self.start_in_reasoning
        self._saw_reasoning = self.start_in_reasoning

    @property
    def saw_reasoning(self) -> bool:
        """Whether a reasoning block was ever open (so reasoning_content applies)."""
        return self._saw_reasoning

    def push(self, delta: str) -> tuple[str, str]:
        """Feed the next decoded text delta.

        Returns:
            ``(reasoning, content)`` text that became final with this delta
            (either may be empty).
        """
        text = self._pending + delta
        self._pending = ""
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            index, tag = _find_first_tag(text)
            if tag is None:
                break
            self._emit(text[:index], reasoning, content)
            self._apply_tag(tag)
            text = text[index + len(tag):]
        keep = _partial_tag_length(text)
        self._pending = text[len(text) - keep:] if keep else ""
        self._emit(text[: len(text) - keep], reasoning, content)
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        """End of output: release any held-back text as literal text.

        Returns:
            ``(reasoning, content)`` text still held back.
        """
        reasoning: list[str] = []
        content: list[str] = []
        self._emit(self._pending, reasoning, content)
        self._pending = ""
        return "".join(reasoning), "".join(content)

    def _apply_tag(self, tag: str) -> None:
        entering_reasoning = tag == THINK_START
        if entering_reasoning == self._in_reasoning:
            return  # stray tag: dropped, mode and pending strip unchanged
        self._in_reasoning = entering_reasoning
        self._saw_reasoning = self._saw_reasoning or entering_reasoning
        if self.strip_newlines:
            self._strip = _STRIP_ONE_NEWLINE if entering_reasoning else _STRIP_ALL_NEWLINES
        else:
            self._strip = _STRIP_NONE

    def _emit(self, text: str, reasoning: list[str], content: list[str]) -> None:
        if self._strip == _STRIP_ONE_NEWLINE and text:
            if text.startswith("\n"):
                text = text[1:]
            self._strip = _STRIP_NONE
        elif self._strip == _STRIP_ALL_NEWLINES:
            text = text.lstrip("\n")
            if text:
                self._strip = _STRIP_NONE
        if text:
            (reasoning if self._in_reasoning else content).append(text)


def _find_first_tag(text: str) -> tuple[int, str | None]:
    best_index, best_tag = len(text), None
    for tag in _TAGS:
        index = text.find(tag)
        if index != -1 and index < best_index:
            best_index, best_tag = index, tag
    return best_index, best_tag


def _partial_tag_length(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a tag."""
    for length in range(min(len(text), _MAX_PARTIAL), 0, -1):
        suffix = text[-length:]
        if any(tag.startswith(suffix) for tag in _TAGS):
            return length
    return 0


def split_reasoning(text: str, start_in_reasoning: bool, *, strip_newlines: bool = True) -> tuple[str | None, str]:
    """Split a complete output into ``(reasoning_content, content)``.

    Args:
        text: the whole decoded output.
        start_in_reasoning: the prompt ended inside an open ``<think>`` block.
        strip_newlines: strip the newline framing around the tags.

    Returns:
        ``reasoning_content`` (None when no reasoning block was ever open)
        and ``content`` (possibly empty).
    """
    splitter = ReasoningSplitter(start_in_reasoning, strip_newlines=strip_newlines)
    reasoning, content = splitter.push(text)
    tail_reasoning, tail_content = splitter.flush()
    return (reasoning + tail_reasoning if splitter.saw_reasoning else None), content + tail_content
