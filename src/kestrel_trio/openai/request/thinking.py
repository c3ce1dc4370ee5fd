"""Which reasoning a chat request asks for: ``reasoning_effort`` and ``chat_template_kwargs.enable_thinking``.

Theory of operation: a request says "think", "do not think", or nothing (the server's default, ``serve
--reasoning``), and every API says it its own way. This module reads Chat Completions' two ways into one
value, :attr:`ChatRequest.thinking <kestrel_trio.openai.ChatRequest>` (True, False or None), with the
field that said it (:attr:`ChatRequest.thinking_param`, which an error names); the Anthropic translator
sets the same two from ``thinking``. The app layer then decides, per model, how the choice is carried
out (``kestrel_trio.app.chat.thinking``).

* ``reasoning_effort``: ``"none"`` and ``"minimal"`` turn reasoning off; ``"low"``, ``"medium"``,
  ``"high"``, ``"xhigh"`` and ``"max"`` turn it on. The levels above off are one level here: the
  models served have a reasoning switch, not effort levels (a budget in tokens is the field below).
* ``chat_template_kwargs.enable_thinking`` (a boolean), the switch vLLM's and llama-server's users set.
* Both may be sent if they agree; a request whose two fields disagree is refused (400), since either
  answer would ignore one of them.

``thinking_token_budget`` (vLLM's name, a non-negative integer) bounds the reasoning in tokens:
:attr:`ChatRequest.thinking_budget`, enforced by forcing ``</think>`` (``kestrel_trio.app.chat.thinking``).
"""

from __future__ import annotations

from typing import Any

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import fail, get_int

__all__ = ["REASONING_EFFORTS", "parse_thinking", "parse_thinking_budget", "BUDGET_FIELD"]

BUDGET_FIELD = "thinking_token_budget"  # vLLM's request field for a reasoning budget

# OpenAI's reasoning_effort values (the openai SDK's ReasoningEffort) and whether each reasons here.
REASONING_EFFORTS: dict[str, bool] = {"none": False, "minimal": False, "low": True, "medium": True, "high": True,
                                      "xhigh": True, "max": True}
_SWITCH = "chat_template_kwargs.enable_thinking"


def parse_thinking(obj: dict, template_kwargs: dict) -> tuple[bool | None, str]:
    """``(thinking, param)`` of a chat body; ``enable_thinking`` is taken out of ``template_kwargs``.

    Args:
        obj: the decoded request body.
        template_kwargs: its ``chat_template_kwargs`` (a fresh dict, changed in place).

    Returns:
        True / False / None (unset), and the field that set it (``"reasoning_effort"`` when neither did).

    Raises:
        BadRequestError: an unknown effort, a non-boolean ``enable_thinking``, or the two disagreeing.
    """
    effort = obj.get("reasoning_effort")
    by_effort = None
    if effort is not None:
        if not isinstance(effort, str) or effort not in REASONING_EFFORTS:
            raise BadRequestError(f"'reasoning_effort' must be one of {', '.join(map(repr, REASONING_EFFORTS))}; "
                                  f"got {effort!r}", param="reasoning_effort")
        by_effort = REASONING_EFFORTS[effort]
    switch: Any = template_kwargs.pop("enable_thinking", None)
    if switch is not None and not isinstance(switch, bool):
        raise fail(_SWITCH, "a boolean", switch)
    if by_effort is not None and switch is not None and by_effort != switch:
        raise BadRequestError(f"'reasoning_effort' {effort!r} and '{_SWITCH}' {str(switch).lower()} disagree; "
                              "send one of them", param="reasoning_effort")
    if switch is not None:
        return switch, _SWITCH
    return by_effort, "reasoning_effort"


def parse_thinking_budget(obj: dict) -> int | None:
    """The body's ``thinking_token_budget`` (tokens of reasoning, >= 0), or None when absent.

    Raises:
        BadRequestError: not an integer, or negative.
    """
    budget = get_int(obj, BUDGET_FIELD)
    if budget is not None and budget < 0:
        raise BadRequestError(f"'{BUDGET_FIELD}' must be at least 0, got {budget}", param=BUDGET_FIELD)
    return budget
