"""One model step for several generations at once (sans-IO, synchronous).

The engine calls :func:`step_generations` in its worker thread: it lays every
active generation's next input end to end, runs one forward pass over them all
(each with its own KV cache), and hands each generation its row of logits.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kestrel_trio._model import Decoder, forward
from kestrel_trio.text.generation import Generation, StepResult

__all__ = ["step_generations"]


def step_generations(decoder: Decoder, generations: Sequence[Generation]) -> list[StepResult]:
    """Advance each generation by one step (a prefill chunk or one decode token).

    Args:
        decoder: the model.
        generations: unfinished generations, each with its own cache.

    Returns:
        One :class:`StepResult` per generation, in order.
    """
    inputs = [g.next_input() for g in generations]  # each [T_i]
    lengths = [int(x.size) for x in inputs]
    positions = np.concatenate(
        [np.arange(g.cache.length, g.cache.length + n, dtype=np.int64) for g, n in zip(generations, lengths)]
    )  # [N]
    logits = forward(decoder, np.concatenate(inputs), positions, [g.cache for g in generations], lengths)  # [B, vocab]
    return [g.advance(row) for g, row in zip(generations, logits)]
