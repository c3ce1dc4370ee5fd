"""Speculative decoding on real trained weights (SmolLM2-135M-Instruct): the greedy tokens of plain decoding.

Prompt lookup (ngram) on a request that copies its prompt, and the model
drafting for itself, must both give plain decoding's tokens exactly, while
taking fewer steps.
"""

from __future__ import annotations

import pytest

from kestrel_trio import load_model
from kestrel_trio.engine.step.batch import step_generations
from kestrel_trio.text.generation import Generation, Phase
from kestrel_trio.text.sampling import SamplingParams
from kestrel_trio.text.speculative import DraftModelDrafter, NgramDrafter, SpeculationState
from real_models import smollm2_135m

PARAGRAPH = ("The old lighthouse stood on the rocky pont at the edge of the vilage for more than two hundred yeers. "
             "Every evening the keeper climbed the narow stairs, cleaned the great lens and lit the lamp.")


@pytest.fixture(scope="module")
def smollm2():
    return load_model(smollm2_135m())


def _generate(model, max_tokens: int, speculation=None) -> tuple[list[int], int]:
    text = model.apply_chat_template([{"role": "user", "content": "Fix the typos: " + PARAGRAPH}])
    tokenizer = model.tokenizer
    g = Generation(model.encode(text), SamplingParams(temperature=0.0, max_tokens=max_tokens), tokenizer=tokenizer,
                   eos_token_ids=tokenizer.eos_token_ids, cache=model.new_cache(max_tokens=1024),
                   vocab_size=model.config.vocab_size, speculation=speculation)
    steps = 0
    while g.phase is not Phase.DONE:
        step_generations(model, [g])
        steps += 1
    return g.generated_ids, steps


def test_prompt_lookup_gives_plain_decodings_tokens_in_fewer_steps(smollm2):
    plain, plain_steps = _generate(smollm2, 32)
    fast, fast_steps = _generate(smollm2, 32, SpeculationState(NgramDrafter(), 8))
    assert fast == plain
    assert len(plain) >= 24
    assert fast_steps < plain_steps * 0.7


def test_the_model_drafting_for_itself_gives_plain_decodings_tokens(smollm2):
    plain, plain_steps = _generate(smollm2, 9)
    drafter = DraftModelDrafter(smollm2, smollm2.new_cache(max_tokens=1024), prefill_chunk=256,
                                vocab_size=smollm2.tokenizer.vocab_size)
    fast, fast_steps = _generate(smollm2, 9, SpeculationState(drafter, 4))
    assert fast == plain
    assert fast_steps <= 1 + -(-(len(plain) - 1) // 5)  # the prompt, then 5 tokens a verify step
