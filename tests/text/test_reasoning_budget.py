"""The reasoning budget, sans-IO: the end of reasoning forced at the budget, on the real Qwen3 tokenizer.

The "model" is a scripted logits vector per step that never wants to stop reasoning (it prefers a filler
word while ``</think>`` has not appeared) and answers once it has, so whatever closes the block early
is the model's own choice (a script) or the budget.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kestrel_trio._model import KVCache
from kestrel_trio.text import SamplingParams, Tokenizer
from kestrel_trio.text.constraints import grammar as g
from kestrel_trio.text.constraints.constraint import compile_constraint, grammar_vocab
from kestrel_trio.text.constraints.reasoning_budget import BudgetState, ReasoningBudget
from kestrel_trio.text.generation import Generation
from kestrel_trio.text.speculative import SpeculationState

VOCAB = 151936  # Qwen3's logits rows
ANSWER = "Blue light scatters most."


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_demo()


@pytest.fixture(scope="module")
def marks(tokenizer) -> tuple[int, int]:
    """(``<think>``, ``</think>``): single tokens of Qwen3's vocabulary."""
    return tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")


def budget(marks, tokens: int, *, starts_inside: bool = True) -> ReasoningBudget:
    return ReasoningBudget(tokens, marks[1], open_token=marks[0], starts_inside=starts_inside)


class Script:
    """The tokens a stubborn reasoner prefers: ``opening`` first, then a filler until the block is closed, then
    ``ANSWER`` and EOS. ``close_after``: the model closes the block itself after that many filler tokens."""

    def __init__(self, tokenizer: Tokenizer, *, opening: list[int] = (), close_after: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.opening = list(opening)
        self.close_after = close_after
        self.filler = tokenizer.encode(" hmm")[0]
        self.end = tokenizer.token_to_id("</think>")
        self.answer = tokenizer.encode("\n\n" + ANSWER) + [min(tokenizer.eos_token_ids)]

    def wanted(self, generated: list[int]) -> int:
        if len(generated) < len(self.opening):
            return self.opening[len(generated)]
        if self.end in generated:
            written = len(generated) - generated.index(self.end) - 1
            return self.answer[min(written, len(self.answer) - 1)]  # a grammar may keep it from the script
        fillers = len(generated) - len(self.opening)
        return self.end if self.close_after is not None and fillers >= self.close_after else self.filler

    def logits(self, generated: list[int], rng: np.random.Generator) -> np.ndarray:
        row = rng.standard_normal(VOCAB).astype(np.float32)  # [vocab]
        row[self.wanted(generated)] = row.max() + 40.0  # the script wins by a wide margin
        return row


def run(tokenizer, script: Script, reasoning: ReasoningBudget | None, *, max_tokens: int = 200,
        logprobs: int | None = None, constraint=None) -> tuple[Generation, list]:
    """Step a generation over ``script``'s logits to its end; the generation and every StepResult."""
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=max_tokens, logprobs=logprobs)
    gen = Generation([1, 2, 3], params, tokenizer=tokenizer, eos_token_ids=tokenizer.eos_token_ids,
                     cache=KVCache(1, 1, 1), vocab_size=VOCAB, reasoning_budget=reasoning, constraint=constraint)
    rng = np.random.default_rng(0)
    steps = []
    while gen.finish_reason is None:
        steps.append(gen.advance(script.logits(gen.generated_ids, rng)))
    return gen, steps


def split(tokenizer, gen: Generation) -> tuple[str, str]:
    """(reasoning, answer) of what the generation wrote (around its ``</think>``)."""
    text = tokenizer.decode(gen.generated_ids)
    reasoning, _, answer = text.partition("</think>")
    return reasoning, answer


def test_a_block_the_prompt_opened_is_cut_at_the_budget_and_the_answer_follows(tokenizer, marks):
    gen, _ = run(tokenizer, Script(tokenizer), budget(marks, 7))
    assert gen.generated_ids[7] == marks[1]  # token 8 is the forced end of reasoning
    assert gen.generated_ids[:7] == [Script(tokenizer).filler] * 7
    reasoning, answer = split(tokenizer, gen)
    assert reasoning == " hmm" * 7 and answer == "\n\n" + ANSWER
    assert gen.finish_reason == "stop" and gen.reasoning.forced_end and gen.reasoning.spent == 7


def test_without_a_budget_the_same_model_reasons_until_max_tokens(tokenizer):
    gen, _ = run(tokenizer, Script(tokenizer), None, max_tokens=40)
    assert gen.finish_reason == "length" and "</think>" not in tokenizer.decode(gen.generated_ids)


def test_a_model_that_closes_before_the_budget_is_left_alone(tokenizer, marks):
    script = Script(tokenizer, close_after=3)
    budgeted, _ = run(tokenizer, script, budget(marks, 10))
    free, _ = run(tokenizer, script, None)
    assert budgeted.generated_ids == free.generated_ids  # the same tokens, drawn by the same seeded sampler
    assert split(tokenizer, budgeted) == (" hmm" * 3, "\n\n" + ANSWER)
    assert not budgeted.reasoning.forced_end and budgeted.reasoning.spent == 3


def test_a_model_that_closes_exactly_at_the_budget_is_not_counted_as_forced(tokenizer, marks):
    gen, _ = run(tokenizer, Script(tokenizer, close_after=4), budget(marks, 5))
    assert split(tokenizer, gen) == (" hmm" * 4, "\n\n" + ANSWER) and not gen.reasoning.forced_end


def test_a_block_the_model_opens_itself_is_counted_from_its_open_token(tokenizer, marks):
    script = Script(tokenizer, opening=[marks[0], *tokenizer.encode("\n")])
    gen, _ = run(tokenizer, script, budget(marks, 4, starts_inside=False))
    assert gen.generated_ids[0] == marks[0] and gen.generated_ids[5] == marks[1]  # "\n" + 3 fillers = 4
    assert tokenizer.decode(gen.generated_ids) == "<think>\n" + " hmm" * 3 + "</think>\n\n" + ANSWER


def test_a_budget_of_zero_closes_the_block_at_once(tokenizer, marks):
    gen, _ = run(tokenizer, Script(tokenizer), budget(marks, 0))
    assert gen.generated_ids[0] == marks[1] and split(tokenizer, gen) == ("", "\n\n" + ANSWER)


def test_the_forced_token_streams_as_text_and_reports_its_logprobs(tokenizer, marks):
    _, steps = run(tokenizer, Script(tokenizer), budget(marks, 2), logprobs=2)
    forced = steps[2]
    assert forced.token_id == marks[1] and forced.text == "</think>"
    assert forced.logprobs.token_id == marks[1] and forced.logprobs.logprob == 0.0  # drawn from it alone
    assert "".join(step.text for step in steps) == " hmm hmm</think>\n\n" + ANSWER


def test_the_budget_state_counts_only_inside_one_block(marks):
    state = BudgetState(budget(marks, 2, starts_inside=False))
    for token in (11, 12, 13):  # before the block: not counted
        state.push(token)
        assert state.forced() is None
    state.push(marks[0])
    state.push(11)
    assert state.forced() is None
    state.push(12)
    assert state.forced() == marks[1]
    state.push(marks[1])
    state.push(marks[0])  # a second <think> in the answer is text: no second budget
    for token in (11, 12, 13):
        state.push(token)
    assert state.forced() is None and state.spent == 2 and state.forced_end


def test_a_negative_budget_is_refused(marks):
    with pytest.raises(ValueError):
        ReasoningBudget(-1, marks[1])


def test_a_grammar_waiting_for_the_reasoning_to_end_takes_the_forced_end_and_constrains_the_answer(
        tokenizer, marks):
    vocab = grammar_vocab(tokenizer, VOCAB)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    constraint = compile_constraint(vocab, g.json_schema_grammar(schema), kind="test", param="response_format",
                                    in_reasoning=True)
    gen, _ = run(tokenizer, Script(tokenizer), budget(marks, 3), constraint=constraint)
    reasoning, answer = split(tokenizer, gen)
    assert reasoning == " hmm" * 3
    assert json.loads(answer.strip().removesuffix("<|im_end|>")) in ({"ok": True}, {"ok": False})


class _Drafts:
    """A drafter that always proposes ``tokens`` (the speculative tests' fixed drafter)."""

    def __init__(self, tokens):
        self.tokens = tokens

    def propose(self, context, k):
        return self.tokens[:k]

    def release(self):
        pass


def test_a_speculative_step_keeps_a_draft_only_where_the_budget_agrees(tokenizer, marks):
    script = Script(tokenizer)
    filler = script.filler
    params = SamplingParams(temperature=0, max_tokens=50)
    spec = SpeculationState(_Drafts([filler] * 4), tokens=4)
    gen = Generation([1, 2, 3], params, tokenizer=tokenizer, eos_token_ids=tokenizer.eos_token_ids,
                     cache=KVCache(1, 1, 1, max_tokens=64), vocab_size=VOCAB, speculation=spec,
                     reasoning_budget=budget(marks, 2))
    rng = np.random.default_rng(0)
    gen.advance(script.logits(gen.generated_ids, rng))  # the prompt, then the first filler
    draft = gen.draft()
    assert draft == [filler] * 4
    rows = np.stack([script.logits(gen.generated_ids + draft[:i], rng) for i in range(len(draft) + 1)])  # [5, vocab]
    result = gen.advance_speculative(rows, draft)
    # Row 0 keeps the drafted second filler; row 1 is past the budget: </think> replaces the third filler.
    assert [step.token_id for step in result.tokens()] == [filler, marks[1]]
    assert gen.generated_ids == [filler, filler, marks[1]]
