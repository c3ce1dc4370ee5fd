"""One model step for several generations at once (sans-IO, synchronous).

The engine calls :func:`step_generations` in its worker thread: it lays every
active generation's next input end to end, runs one forward pass over them all
(each with its own KV cache), and hands each generation its row of logits.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kestrel_trio._model import Decoder, forward
from kestrel_trio._model.prefix_cache import PrefixCache
from kestrel_trio.text.generation import Generation, Phase, StepResult

__all__ = ["step_generations"]


def step_generations(
    decoder: Decoder, generations: Sequence[Generation], prefix_cache: PrefixCache | None = None
) -> list[StepResult]:
    """Advance each generation by one step (a prefill chunk or one decode token).

    Args:
        decoder: the model.
        generations: unfinished generations, each with its own cache.
        prefix_cache: where a new generation looks for its prompt's KV, and
            where a generation's KV is kept once its prompt is in and when it ends.

    Returns:
        One :class:`StepResult` per generation, in order.
    """
    for g in generations:
        if g.fresh:
            g.cache.reserve(len(g.prompt_ids))  # the whole prompt at once: no regrowth copies while prefilling
            if prefix_cache is not None:
                g.reuse_prefix(prefix_cache.restore(g.prompt_ids, g.cache))
    prefilling = [g.phase is Phase.PREFILL for g in generations]
    results = _forward_and_advance(decoder, generations)
    if prefix_cache is not None:
        for g, was_prefilling in zip(generations, prefilling):
            if (was_prefilling and g.phase is not Phase.PREFILL) or g.phase is Phase.DONE:
                prefix_cache.store(g.cached_token_ids(), g.cache)
    return results


def _forward_and_advance(decoder: Decoder, generations: Sequence[Generation]) -> list[StepResult]:
    inputs = [g.next_input() for g in generations]  # each [T_i]
    lengths = [int(x.size) for x in inputs]
    positions = np.concatenate(
        [np.arange(g.cache.length, g.cache.length + n, dtype=np.int64) for g, n in zip(generations, lengths)]
    )  # [N]
    logits = forward(decoder, np.concatenate(inputs), positions, [g.cache for g in generations], lengths)  # [B, vocab]
    return [g.advance(row) for g, row in zip(generations, logits)]
