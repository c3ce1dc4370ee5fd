"""What one step of a generation produced: :class:`StepResult`, the value :meth:`Generation.advance
<kestrel_trio.text.generation.Generation.advance>` and its speculative sibling return."""

from __future__ import annotations

import attrs

from kestrel_trio.text.sampling.sampler import TokenLogprobs

__all__ = ["StepResult"]


@attrs.frozen
class StepResult:
    """What one step produced.

    Attributes:
        text: newly completed text (may be empty: held back for UTF-8 or a possible stop string).
        token_id: the token sampled by this step, or None for a prefill chunk.
        finish_reason: "stop" or "length" once finished, else None.
        logprobs: the sampled token's logprobs when ``params.logprobs`` is set;
            None for an EOS / stop token id that ended the generation (its text
            is never emitted, so it is not reported, as OpenAI does not).
        before: the tokens the same step kept ahead of this one, in order, each
            a StepResult of its own (speculative decoding); () for a plain step.
        stop_sequence: the stop string that ended the generation ("stop" only), else None.
    """

    text: str = ""
    token_id: int | None = None
    finish_reason: str | None = None
    logprobs: TokenLogprobs | None = None
    before: tuple["StepResult", ...] = ()
    stop_sequence: str | None = None

    def tokens(self) -> tuple["StepResult", ...]:
        """Every token this step produced, in order, one StepResult each (one for a plain step)."""
        if not self.before:
            return (self,)
        return (*self.before, attrs.evolve(self, before=()))
