"""A reasoning budget: the end-of-reasoning token forced once a reasoning block has used its tokens.

Theory of operation: Qwen3-style models reason inside ``<think> ... </think>`` before answering, and both
markers are single tokens of their vocabularies. A :class:`ReasoningBudget` names the two token ids, the
budget (tokens of reasoning) and whether the prompt already opened the block (the chat template renders
``<think>\\n`` at the end of the prompt). Each generation keeps its own :class:`BudgetState`, which the
generation state machine (:mod:`kestrel_trio.text.generation`) consults before sampling and feeds with
every token it takes:

* outside the block, tokens are not counted; the open token starts the block (once: a model reasons
  once per answer, and a second ``<think>`` in the answer is just text);
* inside, each token counts against the budget; the end token, sampled by the model, closes the block
  early and nothing more is forced;
* once ``tokens`` tokens were taken inside the block without the end token, :meth:`BudgetState.forced`
  names the end token, and the next token is that one (the sampler draws from it alone), so the
  reasoning holds exactly ``tokens`` tokens and the answer follows as the model writes it.

A model whose end marker is not one token gets no budget: whoever builds the budget refuses the request
instead (the rule lives in the app layer, which knows the field to name).
"""

from __future__ import annotations

import attrs

__all__ = ["ReasoningBudget", "BudgetState"]


@attrs.frozen
class ReasoningBudget:
    """How many tokens a generation may reason, and the markers that delimit its reasoning.

    Attributes:
        tokens: the budget, tokens inside the reasoning block (>= 0; 0 closes the block at once).
        end_token: the id of the end-of-reasoning token (``</think>``), forced when the budget is spent.
        open_token: the id of the token that opens the block (``<think>``), or None when only a prompt
            that opened the block is budgeted.
        starts_inside: the prompt ends inside an open reasoning block (counting starts at the first token).
    """

    tokens: int = attrs.field(validator=attrs.validators.ge(0))
    end_token: int
    open_token: int | None = None
    starts_inside: bool = False

    def start(self) -> BudgetState:
        """A fresh state for one generation."""
        return BudgetState(self)


class BudgetState:
    """One generation's progress through its reasoning budget (see module doc)."""

    def __init__(self, budget: ReasoningBudget) -> None:
        self.budget = budget
        self.inside = budget.starts_inside
        self.closed = False  # the block was closed (by the model or by force): nothing more is counted
        self.spent = 0  # tokens taken inside the block
        self.forced_end = False  # the end token was forced (the budget ran out)

    def forced(self) -> int | None:
        """The token the next step must take (the end token once the budget is spent), or None to sample freely."""
        if self.inside and self.spent >= self.budget.tokens:
            return self.budget.end_token
        return None

    def push(self, token: int) -> None:
        """Record ``token``, the generation's next token (sampled or forced)."""
        if self.closed:
            return
        if not self.inside:
            if token == self.budget.open_token:
                self.inside = True
            return
        if token == self.budget.end_token:
            self.forced_end = self.spent >= self.budget.tokens
            self.inside, self.closed = False, True
            return
        self.spent += 1
