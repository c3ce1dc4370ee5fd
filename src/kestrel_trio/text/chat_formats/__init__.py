"""Chat formats: each model family's markers in its own module, and the registry that picks one for a model.

A family's chat format is what its model writes and reads beyond plain text: how a reasoning block opens
and closes, how a tool call is delimited, and how a rendered prompt is edited to open or close reasoning
or to start a forced call. Each family has one module (:mod:`.qwen3` for reasoning, :mod:`.hermes` for
tool calls, which Qwen2.5 and Qwen3 share); the machines that read model output are family-neutral and
take the family's tags (:mod:`.reasoning`, :mod:`.tool_calls`, :mod:`.output`).

A :class:`ChatFormat` joins them for one model; :func:`format_for` chooses it from the model's vocabulary
(a model whose vocabulary holds Qwen3's ``<think>`` reasons; every model's tool calls are read in Hermes'
format, which the server also writes into the prompt of a template that cannot render tools). The app
layer wires the format to a request; the API layers only turn its parsed pieces into their wire shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from kestrel_trio.text.chat_formats import hermes, qwen3
from kestrel_trio.text.chat_formats.output import ChatOutputParser
from kestrel_trio.text.chat_formats.reasoning import ReasoningTags
from kestrel_trio.text.chat_formats.tool_calls import (
    CallArguments,
    CallStart,
    ToolCall,
    ToolCallTags,
    new_call_id,
)

__all__ = ["ChatFormat", "QWEN3", "HERMES", "FORMATS", "format_for", "ChatOutputParser", "CallStart",
           "CallArguments", "ToolCall", "new_call_id"]


@attrs.frozen
class ChatFormat:
    """One model family's chat format: its markers, its output parser and its prompt edits.

    Attributes:
        name: the registry's name of the format.
        reasoning: the reasoning block's tags, or None for a family that never reasons.
        tools: the tool-call tags.
    """

    name: str
    reasoning: ReasoningTags | None
    tools: ToolCallTags = hermes.TAGS

    @property
    def reasons(self) -> bool:
        """Whether the family writes reasoning blocks (its output is split into reasoning and answer)."""
        return self.reasoning is not None

    def output_parser(self, *, reasoning: bool, starts_in_reasoning: bool, parse_tools: bool,
                      forced_prefix: str = "", make_id: Callable[[], str] = new_call_id) -> ChatOutputParser:
        """A fresh parser of one answer.

        Args:
            reasoning: split reasoning blocks (only where the family reasons).
            starts_in_reasoning: the prompt left a reasoning block open.
            parse_tools: read tool calls (the request offers tools).
            forced_prefix: the forced tool-call opening the prompt ends with (:meth:`forced_tool_prefix`).
            make_id: the tool-call id generator.
        """
        return ChatOutputParser(self.reasoning if reasoning else None, self.tools if parse_tools else None,
                                starts_in_reasoning, forced_prefix, make_id)

    def ends_in_reasoning(self, prompt: str) -> bool:
        """Whether ``prompt`` ends inside an open reasoning block."""
        return self.reasons and qwen3.ends_in_reasoning(prompt)

    def is_closed(self, prompt: str) -> bool:
        """Whether ``prompt`` ends with the empty, closed reasoning block (the answer starts at once)."""
        return self.reasons and qwen3.is_closed(prompt)

    def close_reasoning(self, prompt: str) -> str:
        """``prompt`` with an open reasoning block closed there, or the closed block appended."""
        return qwen3.close_reasoning(prompt) if self.reasons else prompt

    def skip_reasoning(self, prompt: str) -> str:
        """``prompt`` with the closed block appended unless it ends so already: the answer starts at once."""
        return prompt if not self.reasons or qwen3.is_closed(prompt) else prompt + qwen3.CLOSED_BLOCK

    def reasoning_before_answer(self, prompt: str, template_kwargs: Mapping[str, Any]) -> str:
        """What to append to ``prompt`` before an answer constrained from its first token ("" for none)."""
        return qwen3.reasoning_before_answer(prompt, template_kwargs) if self.reasons else ""

    def forced_tool_prefix(self, tool_choice: str | dict | None) -> str:
        """The start of the answer that ``tool_choice`` forces ("" for ``"auto"`` and ``"none"``)."""
        return hermes.forced_tool_prefix(tool_choice)

    def call_text(self, name: str, arguments: str, *, closed: bool = True) -> str:
        """One call as the model writes it (see :func:`.hermes.call_text`)."""
        return hermes.call_text(name, arguments, closed=closed)


QWEN3 = ChatFormat("qwen3", qwen3.TAGS)
HERMES = ChatFormat("hermes", None)  # Qwen2.5, SmolLM2, Llama 3 with the server's Hermes tool prompt
FORMATS = {fmt.name: fmt for fmt in (QWEN3, HERMES)}


def format_for(token_to_id: Callable[[str], int | None] | None) -> ChatFormat:
    """The chat format of a model, from its vocabulary's lookup (``Tokenizer.token_to_id``; None: no tokenizer).

    A vocabulary holding ``<think>`` is Qwen3's (it reasons); any other reads tool calls in Hermes' format.
    """
    if token_to_id is not None and token_to_id(qwen3.TAGS.start) is not None:
        return QWEN3
    return HERMES
