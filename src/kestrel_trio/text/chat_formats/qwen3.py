"""Qwen3's reasoning block (``<think> ... </think>``) and how a prompt opens or closes it.

Qwen3 (and Qwen3-MoE, Qwen3-VL, the Thinking-2507 checkpoints) reason inside ``<think>\\n ... \\n</think>\\n\\n``
before the answer. Its chat template decides where the block starts:

* ``enable_thinking`` true (the default) ends the prompt with the assistant header, and the model writes
  ``<think>`` itself; some templates (Thinking-2507) end the prompt with ``<think>\\n`` already, so the
  answer starts inside the block (:func:`ends_in_reasoning`);
* ``enable_thinking`` false renders the block empty and closed, :data:`CLOSED_BLOCK`, so the answer
  starts at once (:func:`is_closed`).

The server edits a rendered prompt the same way where the template cannot: :func:`close_reasoning` closes
the block (reasoning off on a template without the switch, a forced tool call, an Anthropic prefill) and
:func:`reasoning_before_answer` opens or closes it before an answer constrained from its first token.

Tool calls use Hermes' format (:mod:`.hermes`). Output is split at :data:`TAGS` by
:class:`~.reasoning.ReasoningSplitter`, which drops the newline framing as this template does when it
renders a past answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kestrel_trio.text.chat_formats.reasoning import ReasoningTags

__all__ = ["TAGS", "CLOSED_BLOCK", "OPEN_BLOCK", "ends_in_reasoning", "is_closed", "close_reasoning",
           "reasoning_before_answer"]

TAGS = ReasoningTags("<think>", "</think>")
# What Qwen3's template renders for enable_thinking=False: an empty, closed reasoning block.
CLOSED_BLOCK = TAGS.start + "\n\n" + TAGS.end + "\n\n"
# What it renders to open the block (enable_thinking=True on a prompt that must start reasoning now).
OPEN_BLOCK = TAGS.start + "\n"


def ends_in_reasoning(prompt: str) -> bool:
    """Whether ``prompt`` ends inside an open reasoning block (``<think>`` last, trailing whitespace aside)."""
    return prompt.rstrip().endswith(TAGS.start)


def is_closed(prompt: str) -> bool:
    """Whether ``prompt`` ends with the empty, closed block (the answer starts at once)."""
    return prompt.endswith(CLOSED_BLOCK)


def close_reasoning(prompt: str) -> str:
    """``prompt`` with its reasoning block closed, so the answer starts at once.

    An open block (``<think>`` last) is closed right there; otherwise the empty closed block is appended,
    as ``enable_thinking=False`` renders it. A prompt already closed is returned as is.
    """
    if is_closed(prompt):
        return prompt
    if ends_in_reasoning(prompt):
        return prompt.rstrip() + "\n\n" + TAGS.end + "\n\n"
    return prompt + CLOSED_BLOCK


def reasoning_before_answer(prompt: str, template_kwargs: Mapping[str, Any]) -> str:
    """What to append to a prompt whose answer is constrained from its first token.

    A prompt the template left open for reasoning is kept so (the reasoning before ``</think>`` stays
    free); ``enable_thinking: true`` opens a block; otherwise the answer skips reasoning (the closed block),
    since free reasoning ahead of a constrained answer has no bound.
    """
    if ends_in_reasoning(prompt) or is_closed(prompt):
        return ""
    return OPEN_BLOCK if template_kwargs.get("enable_thinking") is True else CLOSED_BLOCK
