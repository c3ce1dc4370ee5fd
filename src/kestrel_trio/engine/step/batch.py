"""One model step for several generations at once (sans-IO, synchronous: no trio).

The engine calls :func:`step_generations` in its worker thread: it lays every
active generation's next input end to end, runs one forward pass over them all
(each with its own KV cache) through :meth:`Model.step_batch`, and hands each
generation its row of logits. The model is driven through the public
:class:`~kestrel_trio.model.Model` only.

Generations with images (Qwen3-VL) differ in three ways: their first steps
run the vision tower over their images, one vision block per step (so other
streams keep stepping and a cancelled request stops between blocks, the last
block's step going on to the first prefill chunk); a prefill chunk holding
image rows goes alone through :meth:`Model.prefill_image_rows` (it swaps in image
features and uses 3-D positions), while every other chunk and every decode
token joins the batched forward at shifted positions; and they never touch
the prefix cache.

A generation alone in its step whose speculation drafts tokens
(:mod:`kestrel_trio.text.speculative`) has ``[last token, *draft]`` scored
in one forward pass with every row's logits, and keeps 1 to k+1 tokens.
With more than one generation in the step, everyone decodes plainly: a
batch already spends the weight reads speculation would save.

Generations under a grammar (structured outputs) get their token masks
computed beside the forward pass, in a helper thread, so that the masks of a
whole batch cost the step only what is left of them when the logits are in.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kestrel_trio.model import Model, PrefixCache
from kestrel_trio.text.constraints.constraint import start_masks
from kestrel_trio.text.generation import Generation, Phase
from kestrel_trio.text.media.videos import ProcessedVideo
from kestrel_trio.text.step_result import StepResult

__all__ = ["step_generations"]


def step_generations(
    model: Model, generations: Sequence[Generation], prefix_cache: PrefixCache | None = None,
) -> list[StepResult]:
    """Advance each generation by one step (a prefill chunk or one decode token).

    Args:
        model: the model (a Qwen3-VL one when a generation has images).
        generations: unfinished generations, each with its own cache.
        prefix_cache: where a new generation looks for its prompt's KV, and
            where a generation's KV is kept once its prompt is in and when it ends.

    Returns:
        One :class:`StepResult` per generation, in order.
    """
    ready = []
    for g in generations:
        if g.fresh:
            if not g.has_images and prefix_cache is not None:
                g.reuse_prefix(*prefix_cache.reuse(g.prompt_ids, g.cache))
            g.cache.reserve(len(g.prompt_ids) - g.cache.length)  # the whole prompt at once: no regrowth copies
        if g.needs_vision and not _advance_vision(model, g):
            continue  # this step ran one vision block for it instead
        ready.append(g)
    prefilling = [g.phase is Phase.PREFILL for g in ready]
    draft = ready[0].draft() if len(ready) == 1 and len(generations) == 1 else []
    start_masks(g.constraint for g in ready if g.constraint is not None and g.samples_next)  # beside the forward
    if draft:
        results = {id(ready[0]): _verify(model, ready[0], draft)}
    else:
        results = dict(zip(map(id, ready), _forward_and_advance(model, ready)))
    if prefix_cache is not None:
        for g, was_prefilling in zip(ready, prefilling):
            if g.has_images:
                continue
            if (was_prefilling and g.phase is not Phase.PREFILL) or g.phase is Phase.DONE:
                prefix_cache.store(g.cached_token_ids(), g.cache, in_use=g.phase is not Phase.DONE)
    return [results.get(id(g), StepResult()) for g in generations]


def _advance_vision(model: Model, g: Generation) -> bool:
    """Run the next vision block of ``g``'s images; True once they are all encoded.

    One block per step keeps every step short, so other streams keep flowing
    and an abandoned request is dropped between two blocks.
    """
    if not g.vision_started:  # Model.image_prompt_steps refuses a model without a vision tower
        media = g.take_images()  # the pixels now live in the running encoder
        images = [m for m in media if not isinstance(m, ProcessedVideo)]
        videos = [m for m in media if isinstance(m, ProcessedVideo)]
        g.start_vision(model.image_prompt_steps(np.asarray(g.prompt_ids, dtype=np.int64), *_stacked(images),
                                                *_stacked(videos)))
    return g.step_vision()


def _stacked(media: list) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(pixel_values [n_patches, C*T*P*P], grid_thw [n, 3]) of images or of videos; Nones for none."""
    if not media:
        return None, None
    return (np.concatenate([m.pixel_values for m in media]),  # [n_patches, C*T*P*P]
            np.asarray([m.grid_thw for m in media], dtype=np.int64))  # [n, 3]


def _forward_and_advance(model: Model, generations: Sequence[Generation]) -> list[StepResult]:
    alone = [g.chunk_has_image_rows() for g in generations]
    logits: list[np.ndarray | None] = [None] * len(generations)
    for i, g in enumerate(generations):
        if alone[i]:
            assert g.vl_prompt is not None
            logits[i] = model.prefill_image_rows(g.cache, g.vl_prompt, *g.prefill_range())  # [vocab]
    batched = [i for i in range(len(generations)) if not alone[i]]
    if batched:
        group = [generations[i] for i in batched]
        inputs = [g.next_input() for g in group]  # each [T_i]
        positions = np.concatenate([g.next_positions() for g in group])  # [N]
        wanted = [g.samples_next for g in group]  # a prompt chunk before the last needs no logits
        rows = model.step_batch(np.concatenate(inputs), positions, [g.cache for g in group],
                                [int(x.size) for x in inputs], wanted=wanted)  # [sum(wanted), vocab]
        for i, row in zip([i for i, w in zip(batched, wanted) if w], rows):
            logits[i] = row
    return [g.advance(row) for g, row in zip(generations, logits)]


def _verify(model: Model, g: Generation, draft: list[int]) -> StepResult:
    """Score ``[last token, *draft]`` in one forward pass and let ``g`` keep what its sampler accepts."""
    tokens = np.concatenate([g.next_input(), np.asarray(draft, dtype=np.int64)])  # [1 + k]
    positions = np.arange(g.cache.length, g.cache.length + tokens.size, dtype=np.int64)  # [1 + k]
    rows = model.step_batch(tokens, positions, [g.cache], [tokens.size], all_logits=True)  # [1 + k, vocab]
    return g.advance_speculative(rows, draft)
