"""Splitting model output into reasoning and answer (content) at a family's reasoning tags.

The tags are the family's (Qwen3's ``<think>`` / ``</think>``, :mod:`.qwen3`); the examples below use them.

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

__all__ = ["ReasoningTags", "ReasoningSplitter", "split_reasoning"]

@attrs.frozen
class ReasoningTags:
    """The text that opens and closes a family's reasoning block (``<think>`` / ``</think>`` in Qwen3)."""

    start: str
    end: str


# What to strip from the start of the text that follows a tag.
_STRIP_NONE = 0
_STRIP_ONE_NEWLINE = 1
_STRIP_ALL_NEWLINES = 2


@attrs.define
class ReasoningSplitter:
    """Streaming splitter of ``<think>...</think>`` output.

    Args:
        tags: the family's reasoning tags.
        start_in_reasoning: the prompt ended inside an open ``<think>`` block.
        strip_newlines: strip the newline framing around the tags (see module doc).
    """

    tags: ReasoningTags
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
            index, tag = _find_first_tag(text, self.tags)
            if tag is None:
                break
            self._emit(text[:index], reasoning, content)
            self._apply_tag(tag)
            text = text[index + len(tag):]
        keep = _partial_tag_length(text, self.tags)
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
        entering_reasoning = tag == self.tags.start
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


def _find_first_tag(text: str, tags: ReasoningTags) -> tuple[int, str | None]:
    best_index, best_tag = len(text), None
    for tag in (tags.start, tags.end):
        index = text.find(tag)
        if index != -1 and index < best_index:
            best_index, best_tag = index, tag
    return best_index, best_tag


def _partial_tag_length(text: str, tags: ReasoningTags) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a tag."""
    for length in range(min(len(text), max(len(tags.start), len(tags.end)) - 1), 0, -1):
        suffix = text[-length:]
        if tags.start.startswith(suffix) or tags.end.startswith(suffix):
            return length
    return 0


def split_reasoning(tags: ReasoningTags, text: str, start_in_reasoning: bool, *,
                    strip_newlines: bool = True) -> tuple[str | None, str]:
    """Split a complete output into ``(reasoning_content, content)``.

    Args:
        tags: the family's reasoning tags.
        text: the whole decoded output.
        start_in_reasoning: the prompt ended inside an open ``<think>`` block.
        strip_newlines: strip the newline framing around the tags.

    Returns:
        ``reasoning_content`` (None when no reasoning block was ever open)
        and ``content`` (possibly empty).
    """
    splitter = ReasoningSplitter(tags, start_in_reasoning, strip_newlines=strip_newlines)
    reasoning, content = splitter.push(text)
    tail_reasoning, tail_content = splitter.flush()
    return (reasoning + tail_reasoning if splitter.saw_reasoning else None), content + tail_content
