"""A batched model step whose MemoryError fails only the generations that needed the memory (sans-IO, synchronous).

Theory of operation: the engine's worker thread runs one batched step for
every active generation. If the operating system refuses an allocation
(MemoryError, also numpy's, which an address-space limit raises), nothing
can say which generation's arrays were too many: a long prompt's prefill
chunk, a new cache, or only the sum of them all. So the step is taken apart:

1. Every generation whose state had not moved when the error came (none
   was sampled yet: all logits come before any sampling) has its cache cut
   back to the tokens it had counted (``KVCache.truncate``), so a layer that
   was half written is forgotten.
2. Each is then stepped alone, in batch order. One that still cannot get
   its memory alone is the one that needed it: it ends with
   :class:`~kestrel_trio.errors.OutOfMemoryError` (its cache cut back again),
   the others have their step.
3. Sampling catches its own MemoryError (``Generation.memory_failure``), so
   a batched call returns every other generation's result; the one whose
   sampling failed is undone and stepped again alone, as above. A
   generation whose state had moved before an error (a token taken whose
   result was never returned) cannot be stepped again without losing that
   token: it ends with an OutOfMemoryError saying so. So does a Qwen3-VL
   generation whose vision encoder was the one that failed (the encoder
   cannot resume).

The step function (:func:`kestrel_trio.engine.step.batch.step_generations`) is a
parameter so the engine's own (patchable) step is the one retried.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from kestrel_trio.errors import KestrelError, OutOfMemoryError
from kestrel_trio.text.generation import Generation
from kestrel_trio.text.step_result import StepResult

__all__ = ["step_contained"]

log = logging.getLogger("kestrel_trio.engine")

Outcome = StepResult | KestrelError


def step_contained(step: Callable[..., list[StepResult]], model, generations: Sequence[Generation],
                   *args: object) -> list[Outcome]:
    """``step(model, generations, *args)``, with a MemoryError confined to the generations it belongs to.

    Returns:
        One outcome per generation, in order: its StepResult, or the error that ends it.
    """
    marks = [g.progress() for g in generations]
    try:
        results: list[Outcome] = list(step(model, generations, *args))
    except MemoryError:
        log.warning("a batched step of %d generation(s) ran out of memory; stepping them one by one",
                    len(generations))
        return [_after_a_failed_batch(step, model, g, mark, len(generations), args)
                for g, mark in zip(generations, marks)]
    for i, g in enumerate(generations):
        failure = g.take_memory_failure()  # sampling ran out of memory; the others' results stand
        if failure == "fatal":
            results[i] = _out_of_memory(g, "while its next token was sampled, so the token is lost")
        elif failure == "retry":
            g.roll_back()
            results[i] = (_out_of_memory(g, "in this generation's model step, even run alone") if len(generations) == 1
                          else _alone(step, model, g, args))
    return results


def _after_a_failed_batch(step, model, g: Generation, mark: tuple, batch: int, args: tuple) -> Outcome:
    """``g``'s outcome once its batched step raised MemoryError: stepped again alone when that can be done."""
    if g.progress() != mark or g.take_memory_failure() == "fatal":
        g.roll_back()
        return _out_of_memory(g, "after this generation's next token was computed, so the token is lost")
    if g.vision_failed():
        return _out_of_memory(g, "while encoding this request's images")
    g.roll_back()
    if batch == 1:
        return _out_of_memory(g, "in this generation's model step, even run alone")
    return _alone(step, model, g, args)


def _alone(step, model, g: Generation, args: tuple) -> Outcome:
    """``g`` stepped alone (its cache already cut back); the one that still cannot get memory alone needed it."""
    try:
        result = step(model, [g], *args)[0]
    except MemoryError:
        result = None
    except Exception:
        log.exception("a model step failed for one generation")
        g.roll_back()
        return KestrelError("the model step failed; see the server log")
    if result is None or g.take_memory_failure() is not None:
        g.roll_back()
        return _out_of_memory(g, "in this generation's model step, even run alone")
    return result


def _out_of_memory(g: Generation, when: str) -> OutOfMemoryError:
    log.warning("a generation (%d prompt tokens, %d generated) ran out of memory %s", g.prompt_tokens,
                g.completion_tokens, when)
    return OutOfMemoryError(
        f"The server ran out of memory {when} ({g.prompt_tokens} prompt tokens, {g.completion_tokens} generated); "
        "the other generations go on. Retry later, or with a shorter prompt or max_tokens.")
