"""Carrying out a chat request's reasoning choice on the served model, and the server's default.

Theory of operation: a request asks for reasoning on, off, or nothing
(:attr:`ChatRequest.thinking <kestrel_trio.openai.ChatRequest>`, set from ``reasoning_effort``,
``chat_template_kwargs.enable_thinking``, Anthropic's ``thinking``, ...); nothing means the server's
default, ``serve --reasoning``: ``auto`` (the model's own: its chat template's default), ``on`` or
``off``. How a choice is carried out depends on the model:

* a hybrid model whose chat template reads ``enable_thinking`` (Qwen3, Qwen3-MoE, Qwen3-VL): the choice
  is passed to the template, which opens the reasoning block or renders it empty and closed;
* a model with ``<think>`` in its vocabulary whose template has no switch (an always-reasoning
  checkpoint such as Qwen3-Thinking-2507, or an instruct one): "off" closes the reasoning block in the
  prompt (the empty block the switch would render), so the answer starts at once; "on" holds when the
  template opens a reasoning block itself, and is refused (400) when it does not, since the
  checkpoint was not trained to reason there;
* a model without ``<think>`` (Qwen2.5, Llama 3, SmolLM2): it never reasons, so "off" holds as it is
  and an explicit "on" is refused (400 naming the field). The server's ``--reasoning on`` is a default
  and not a request: on such a model it leaves answers as they are.

A request may also bound its reasoning (:attr:`ChatRequest.thinking_budget`, Anthropic's
``thinking.budget_tokens``): :func:`reasoning_budget` turns it into the generation's
:class:`~kestrel_trio.text.constraints.reasoning_budget.ReasoningBudget`, which forces ``</think>`` once the block
holds that many tokens. It needs ``</think>`` as one token of the vocabulary (as in every Qwen3);
a reasoning model without it is refused (400 naming the budget's field) rather than left unbounded.
Where the prompt already closed the block (reasoning off, a forced tool call, a prefill) or the model
never reasons, there is nothing to bound and the budget is moot.
"""

from __future__ import annotations

import attrs

from kestrel_trio import openai as oa
from kestrel_trio.errors import BadRequestError, KestrelError
from kestrel_trio.model import Model
from kestrel_trio.text.chat_formats import QWEN3, ChatFormat, format_for
from kestrel_trio.text.constraints.reasoning_budget import ReasoningBudget

__all__ = ["REASONING_DEFAULTS", "check_reasoning_default", "ThinkingPlan", "plan_thinking", "reasoning_budget",
           "chat_format", "model_thinks"]

REASONING_DEFAULTS = ("auto", "on", "off")


def check_reasoning_default(value: str) -> str:
    """``value`` if it is a ``--reasoning`` mode (``auto``, ``on``, ``off``), else a KestrelError naming them."""
    if value not in REASONING_DEFAULTS:
        raise KestrelError(f"reasoning must be one of {', '.join(REASONING_DEFAULTS)}, got {value!r}")
    return value


@attrs.frozen
class ThinkingPlan:
    """How one chat request's reasoning choice is carried out (see module doc).

    Attributes:
        template_value: the ``enable_thinking`` passed to the chat template, or None to pass none.
        close_block: close the reasoning block in the rendered prompt (off, on a template without the switch).
        require_open: the rendered prompt must open a reasoning block (an explicit on without the switch).
        param: the request field named by a refusal.
        chat_format: the model's chat format (its reasoning markers and prompt edits).
    """

    template_value: bool | None = None
    close_block: bool = False
    require_open: bool = False
    param: str = "reasoning_effort"
    chat_format: ChatFormat = QWEN3

    def template_kwargs(self, chat: oa.ChatRequest) -> dict:
        """The request's template variables, with the switch when the template gets it."""
        if self.template_value is None:
            return chat.chat_template_kwargs
        return {**chat.chat_template_kwargs, "enable_thinking": self.template_value}

    def finish_prompt(self, prompt: str) -> str:
        """The rendered prompt with the choice applied (a closed block appended), or a 400 if it cannot hold."""
        if self.require_open and not self.chat_format.ends_in_reasoning(prompt):
            raise BadRequestError(f"'{self.param}' asks for reasoning, but this model's chat template has no "
                                  "reasoning switch and does not open a reasoning block", param=self.param)
        return self.chat_format.close_reasoning(prompt) if self.close_block else prompt


def plan_thinking(model: Model, chat: oa.ChatRequest, default: str) -> ThinkingPlan:
    """The plan for ``chat``'s reasoning on ``model`` under the server's ``default`` (see module doc).

    Raises:
        BadRequestError: the request asks for reasoning from a model that has none (``param`` names its field).
    """
    explicit = chat.thinking is not None
    wanted = chat.thinking if explicit else {"on": True, "off": False}.get(default)
    param = chat.thinking_param
    fmt = chat_format(model)
    if wanted is None:
        return ThinkingPlan(param=param, chat_format=fmt)
    if _has_switch(model):
        return ThinkingPlan(chat_format=fmt, template_value=wanted, param=param)
    if not model_thinks(model):
        if wanted and explicit:
            raise BadRequestError(f"'{param}' asks for reasoning, but model {model.name!r} has no reasoning mode "
                                  "(no <think> token): it answers directly", param=param)
        return ThinkingPlan(param=param, chat_format=fmt)
    if wanted:
        return ThinkingPlan(chat_format=fmt, require_open=explicit, param=param)
    return ThinkingPlan(chat_format=fmt, close_block=True, param=param)


def reasoning_budget(model: Model, chat: oa.ChatRequest, prompt: str, *, closed: bool) -> ReasoningBudget | None:
    """The budget the generations of ``chat`` reason within, or None (see module doc).

    Args:
        model: the served model (its vocabulary holds the markers).
        chat: the request (``thinking_budget`` and the field that set it).
        prompt: the finished prompt text (whether it ends inside an open ``<think>`` block).
        closed: the prompt closed the reasoning block, so the answer starts at once.

    Raises:
        BadRequestError: the model reasons but ``</think>`` is not one token of its vocabulary.
    """
    fmt = chat_format(model)
    if chat.thinking_budget is None or closed or fmt.reasoning is None:
        return None
    tokenizer = model.require_tokenizer()
    end = tokenizer.token_to_id(fmt.reasoning.end)
    if end is None:
        raise BadRequestError(f"'{chat.thinking_budget_param}' cannot be enforced on model {model.name!r}: its "
                              f"end of reasoning, {fmt.reasoning.end}, is not a single token",
                              param=chat.thinking_budget_param)
    return ReasoningBudget(chat.thinking_budget, end, open_token=tokenizer.token_to_id(fmt.reasoning.start),
                           starts_inside=fmt.ends_in_reasoning(prompt))


def chat_format(model: Model) -> ChatFormat:
    """The served model's chat format, chosen from its vocabulary (:func:`.chat_formats.format_for`)."""
    return format_for(None if model.tokenizer is None else model.tokenizer.token_to_id)


def model_thinks(model: Model) -> bool:
    """Whether the model reasons (its output is split into reasoning and answer): its chat format has a block."""
    return chat_format(model).reasons


def _has_switch(model: Model) -> bool:
    try:
        model.check_chat_template_kwargs(["enable_thinking"])
    except BadRequestError:
        return False
    return True
