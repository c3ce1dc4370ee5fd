"""The engine's side of speculative decoding: which generations draft, with what, and the memory it costs.

The drafting itself is sans-IO (:mod:`kestrel_trio.text.speculative`) and runs
in the worker thread inside a step (:mod:`kestrel_trio.engine.step.batch`, only
when a generation is alone in its step). Here the engine's configuration
(``EngineLimits.speculative``, ``speculative_tokens`` and the draft model) is
checked once, and each admitted generation gets its own
:class:`~kestrel_trio.text.speculative.SpeculationState`, or none where
speculation steps aside (:func:`~kestrel_trio.text.speculative.steps_aside`).

A draft model's KV cache is one more cache per generation, reserved like the
target's (prompt + max_tokens, in whole blocks) and counted in the job's KV
reservation, so the KV budget still bounds every live KV byte; a generation
whose reservation would not fit the budget with the draft's cache beside it
decodes plainly.
"""

from __future__ import annotations

from kestrel_trio.engine.types import EngineLimits, GenerationRequest
from kestrel_trio.errors import KestrelError
from kestrel_trio.model import Model
from kestrel_trio.text.speculative import (
    DEFAULT_SPECULATIVE_TOKENS, DraftModelDrafter, NgramDrafter, SpeculationState, steps_aside,
)

__all__ = ["Speculation"]


class Speculation:
    """Speculative decoding as configured for one engine.

    Args:
        limits: ``speculative`` (the mode) and ``speculative_tokens`` (k); ``kv_dtype`` and
            ``prefill_chunk`` for a draft model's cache and catch-up.
        model: the served model.
        draft_model: the draft model (mode "draft" only); its vocabulary must be the model's.

    Raises:
        KestrelError: mode "draft" without a draft model, or a draft model with another mode.
    """

    def __init__(self, limits: EngineLimits, model: Model, draft_model: Model | None = None) -> None:
        self.mode = limits.speculative
        if self.mode == "draft" and draft_model is None:
            raise KestrelError("speculative decoding with a draft model needs the draft model (--draft-model)")
        if draft_model is not None and self.mode != "draft":
            raise KestrelError(f"a draft model was given, but speculative decoding is {self.mode!r}, not 'draft'")
        self.draft_model = draft_model
        self.tokens = limits.speculative_tokens or DEFAULT_SPECULATIVE_TOKENS.get(self.mode, 0)
        self._dtype = limits.kv_dtype
        self._chunk = limits.prefill_chunk
        self._vocab = model.tokenizer.vocab_size if model.tokenizer is not None else model.config.vocab_size

    @property
    def draft_token_bytes(self) -> int:
        """KV bytes the draft model's cache takes per token (0 without a draft model)."""
        return self.draft_model.kv_token_bytes(self._dtype) if self.draft_model is not None else 0

    def state_for(self, request: GenerationRequest, reserved_tokens: int, room_bytes: int) -> SpeculationState | None:
        """The speculation of one new generation, or None where it decodes plainly.

        Args:
            request: the generation's request.
            reserved_tokens: its KV reservation (tokens), which a draft model's cache gets too.
            room_bytes: KV budget bytes left beside the target's reservation (a draft cache must fit them).
        """
        if self.mode == "off" or steps_aside(request.params, constrained=request.constraint is not None,
                                             images=bool(request.images)):
            return None
        if self.draft_model is None:
            return SpeculationState(NgramDrafter(), self.tokens)
        if reserved_tokens * self.draft_token_bytes > room_bytes:
            return None
        cache = self.draft_model.new_cache(self._dtype, max_tokens=reserved_tokens)
        drafter = DraftModelDrafter(self.draft_model, cache, prefill_chunk=self._chunk,
                                    vocab_size=self._vocab)
        return SpeculationState(drafter, self.tokens)

    def kv_bytes(self, speculation: SpeculationState | None) -> int:
        """The KV bytes reserved for a generation's draft cache (0 without one)."""
        drafter = speculation.drafter if speculation is not None else None
        if not isinstance(drafter, DraftModelDrafter) or drafter.cache.max_tokens is None:
            return 0
        return drafter.cache.max_tokens * self.draft_token_bytes

    def report(self) -> dict:
        """What /health shows: the mode, k and the draft model's name."""
        return {"mode": self.mode, "tokens": self.tokens if self.mode != "off" else 0,
                "draft_model": self.draft_model.name if self.draft_model is not None else None}
