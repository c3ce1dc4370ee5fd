"""One answer's output text -> reasoning, content and tool-call pieces, as it streams (sans-IO).

Theory of operation: text goes through the family's :class:`~.reasoning.ReasoningSplitter` (when the
model reasons), then its content part through the :class:`~.tool_calls.ToolCallParser` (when tool calls
are parsed). Each :meth:`ChatOutputParser.push` returns ``(reasoning, pieces)``: the reasoning text that
became final, then the content strings and :class:`~.tool_calls.CallStart` /
:class:`~.tool_calls.CallArguments` pieces, in order. A marker split over deltas is held back until it is
whole, so what comes out never depends on how the text was cut. :meth:`ChatOutputParser.finish` releases
what is held back at the end of the output.

A forced tool-call opening (``tool_choice``) is already in the prompt, so the tool-call parser reads it
first; what it releases is handed out with the first text (or at the end), never as content of its own.
"""

from __future__ import annotations

import attrs

from kestrel_trio.text.chat_formats.reasoning import ReasoningSplitter, ReasoningTags
from kestrel_trio.text.chat_formats.tool_calls import ToolCallParser, ToolCallTags, new_call_id

__all__ = ["ChatOutputParser"]


@attrs.define
class ChatOutputParser:
    """The parse of one answer (see module doc).

    Args:
        reasoning_tags: split reasoning blocks at these tags, or None (the model never reasons).
        tool_tags: read tool calls delimited by these tags, or None (the request offers no tools).
        starts_in_reasoning: the prompt left a reasoning block open.
        forced_prefix: output text the prompt already holds (a forced tool-call opening).
        make_id: the tool-call id generator.
    """

    reasoning_tags: ReasoningTags | None = None
    tool_tags: ToolCallTags | None = None
    starts_in_reasoning: bool = False
    forced_prefix: str = ""
    make_id: object = new_call_id
    _splitter: ReasoningSplitter | None = attrs.field(init=False, default=None)
    _parser: ToolCallParser | None = attrs.field(init=False, default=None)
    _prefix_pieces: list = attrs.field(init=False, factory=list)  # what the forced prefix released, sent first

    def __attrs_post_init__(self) -> None:
        if self.reasoning_tags is not None:
            self._splitter = ReasoningSplitter(self.reasoning_tags, self.starts_in_reasoning)
        if self.tool_tags is not None:
            self._parser = ToolCallParser(self.tool_tags, self.make_id)
            self._prefix_pieces = self._parser.push(self.forced_prefix)

    def push(self, text: str) -> tuple[str, list]:
        """Feed the next decoded text delta.

        Returns:
            ``(reasoning, pieces)``: reasoning text and the content / call pieces that became final.
        """
        if not text:
            return "", []
        reasoning, content = self._splitter.push(text) if self._splitter else ("", text)
        return reasoning, self._parse(content)

    def finish(self) -> tuple[str, list]:
        """End of output: the reasoning and pieces still held back."""
        reasoning, content = self._splitter.flush() if self._splitter else ("", "")
        pieces = self._parse(content)  # before the flush: the content precedes what the parser still holds
        return reasoning, pieces + (self._parser.flush() if self._parser else [])

    def _parse(self, content: str) -> list:
        if self._parser is None:
            return [content] if content else []
        pieces, self._prefix_pieces = self._prefix_pieces, []
        return pieces + (self._parser.push(content) if content else [])
