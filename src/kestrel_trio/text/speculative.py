"""Speculative decoding's sans-IO parts: drafters, the acceptance rule, the per-generation policy.

Theory of operation: at batch 1 a decode step reads every weight to produce
one token, and a forward pass over a few more rows costs little more (on two
cores, SmolLM2-135M: 9 rows 1.4x one row). So a *drafter* guesses the next k
tokens cheaply, the target model scores ``[last token, d1..dk]`` in one
forward pass (k+1 rows of logits), and :meth:`Generation.advance_speculative
<kestrel_trio.text.generation.Generation.advance_speculative>` walks the rows
in order: row i decides token i, through the very sampler, detokenizer, stop
strings and length limit a plain step uses. A drafted token that the row
accepts is kept and the walk goes on; the first rejection is replaced by a
token drawn from the row's corrected distribution, and the walk ends; when
all k are accepted, row k yields one more token. Every step thus gives
1 to k+1 tokens, and the KV cache is cut back to the tokens kept.

The acceptance rule (:func:`accept_or_resample`) is speculative sampling
(Leviathan et al. 2023; Chen et al. 2023): accept ``d`` with probability
``min(1, p(d) / q(d))``, else draw from ``max(0, p - q)`` renormalised, where
``p`` is the distribution plain decoding draws from (after penalties,
temperature, top-k, top-p, min-p) and ``q`` the drafter's. Both drafters
here are deterministic (``q`` a point mass on ``d``): ``d`` is accepted with
probability ``p(d)``, else a token is drawn from ``p`` without ``d``. Each
emitted token is then distributed exactly as plain decoding's. At
temperature 0, ``p`` is a point mass on the argmax: the draft is kept while
it equals the argmax, so the tokens are those of plain decoding.

Drafters:

* :class:`NgramDrafter` (prompt lookup): the longest suffix of the text so far
  (``max_n`` down to ``min_n`` tokens) that occurred before, most recent
  occurrence first; the draft is what followed it. Free: no model runs.
  Suffixes of one token are not tried by default: a lone token's last
  occurrence seldom predicts what follows it, and those drafts' rejections
  paused drafting before the long matches came (bench_speculative, SmolLM2
  Q4_1, k=5, 4 runs each alternated: copy-heavy 2.10x with 1-token suffixes,
  2.48x without; free-form 0.95x and 1.07x).
* :class:`DraftModelDrafter`: a small model with the same vocabulary, run
  greedily for k tokens over its own KV cache, which is kept in step with the
  accepted tokens (cut back to the common prefix, then fed what it misses).

Policy (:class:`SpeculationState`, one per generation): drafting pays while
a verify step yields more than its extra cost. Over the last ``window``
verify steps the mean accepted tokens per step is compared with
``min_accepted``; below it, drafting pauses for ``pause`` tokens (plain
decode steps), and each further pause lasts twice as long (up to
``max_pause``), so a generation that never copies soon decodes plainly while
one that starts copying later is still caught. A step with no draft (no
n-gram match) is a plain step and is not counted.
"""

from __future__ import annotations

import collections
from typing import Protocol, Sequence

import attrs
import numpy as np

from kestrel_trio._model import KVCache, ModelConfig

__all__ = [
    "SPECULATIVE_MODES", "DEFAULT_SPECULATIVE_TOKENS", "Drafter", "NgramDrafter", "DraftModelDrafter",
    "SpeculationState", "accept_or_resample", "steps_aside", "MAX_SPECULATIVE_TOKENS",
]

SPECULATIVE_MODES = ("off", "ngram", "draft")
# Drafted tokens per verify step, by mode: prompt lookup is free, so it drafts more; a draft model pays per token.
# ngram's 5: on a quiet machine (bench_speculative, SmolLM2 Q4_1) k=5 met both targets on both kernels
# (copy-heavy 2.44x / 2.47x, free-form 0.99x / 1.00x, SkylakeX / Haswell); k=8 copied faster under
# SkylakeX (3.28x) but cost free-form text 0.90x under Haswell, where a 9-row verify step costs more.
DEFAULT_SPECULATIVE_TOKENS = {"ngram": 5, "draft": 4}
MAX_SPECULATIVE_TOKENS = 31  # 32 rows a verify step at most: the small-batch product range (matmul.SMALL_BATCH_ROWS)


def steps_aside(params, *, constrained: bool, images: bool) -> str | None:
    """Why speculative decoding does not apply to a generation, or None when it does.

    Args:
        params: its SamplingParams.
        constrained: it follows a grammar (structured outputs): each drafted token would need
            the grammar advanced, and rolled back on rejection.
        images: its prompt has images (Qwen3-VL).

    A seeded request that samples (temperature > 0) decodes plainly too: speculation draws its
    random numbers differently (an acceptance draw per drafted token), and whether a step
    speculates depends on the other requests in the batch, so the same seed would not give the
    same text twice.
    """
    if constrained:
        return "grammar"
    if images:
        return "images"
    if params.temperature > 0 and params.seed is not None:
        return "seeded sampling"
    return None


def accept_or_resample(p: np.ndarray, q: np.ndarray, draft: int, rng: np.random.Generator) -> int:
    """Speculative sampling's rule for one drafted token: ``draft`` itself, or a replacement.

    Args:
        p: float [n], the target distribution (sums to 1).
        q: float [n], the drafter's distribution the draft came from (sums to 1; one-hot for a deterministic drafter).
        draft: index of the drafted token in ``p`` and ``q`` (``q[draft] > 0``).
        rng: the generation's random generator.

    Returns:
        ``draft`` when accepted (probability ``min(1, p[draft] / q[draft])``), else an index drawn from
        ``max(0, p - q)`` renormalised (never ``draft``). The result is distributed as ``p``.
    """
    if rng.random() * q[draft] < p[draft]:  # u < p/q without dividing by a tiny q
        return draft
    residual = np.maximum(p - q, 0.0)  # [n]
    residual[draft] = 0.0  # exactly 0 in algebra (rejected only when p < q there); rounding must not revive it
    total = residual.sum()
    if total <= 0.0:  # p == q up to rounding: rejection had probability ~0
        return draft
    cdf = np.cumsum(residual)
    return min(int(np.searchsorted(cdf, rng.random() * total, side="right")), p.size - 1)


class Drafter(Protocol):
    """Proposes the next tokens of a sequence (sans-IO: any model it runs, it runs in the caller's thread)."""

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` guesses of the tokens after ``context`` (prompt and output so far); [] for no guess."""

    def release(self) -> None:
        """Let go of any memory held for the sequence (the generation is over)."""


class NgramDrafter:
    """Prompt lookup: propose what followed the most recent earlier occurrence of the context's suffix.

    The index of n-grams (``min_n`` to ``max_n`` tokens) grows with the context,
    each position indexed once, so a proposal costs O(new tokens), not O(context).

    Args:
        max_n: the longest suffix tried (tokens).
        min_n: the shortest suffix tried (tokens).
    """

    def __init__(self, max_n: int = 3, min_n: int = 2) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n
        self._seen: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its latest occurrence
        self._indexed = 0  # n-grams ending at or before this position are in _seen

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        end = len(context)
        # Index n-grams ending before the current end: the suffix itself must match an EARLIER occurrence.
        for stop in range(self._indexed + 1, end):
            for n in range(self.min_n, min(self.max_n, stop) + 1):
                self._seen[tuple(context[stop - n : stop])] = stop
        self._indexed = max(self._indexed, end - 1)
        if k <= 0:
            return []
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            found = self._seen.get(tuple(context[end - n :]))
            if found is not None:
                return list(context[found : found + k])
        return []

    def release(self) -> None:
        self._seen.clear()


class DraftModel(Protocol):
    """What a :class:`DraftModelDrafter` steps (the public ``kestrel_trio.model.Model``)."""

    @property
    def config(self) -> ModelConfig: ...

    def prefill(self, cache: KVCache, token_ids: Sequence[int], chunk: int) -> np.ndarray: ...


class DraftModelDrafter:
    """A small model with the target's vocabulary, run greedily over its own KV cache.

    Args:
        model: the draft model (its vocabulary must be the target's; the caller checks).
        cache: its own empty KV cache for this sequence, with room for the sequence's reservation.
        prefill_chunk: tokens per forward pass while it catches up with the context (its prompt).
        vocab_size: ids at or past this (the tokenizer's size) are never proposed (padding rows).
    """

    def __init__(self, model: DraftModel, cache: KVCache, *, prefill_chunk: int, vocab_size: int) -> None:
        self.model = model
        self.cache = cache
        self._chunk = prefill_chunk
        self._vocab = vocab_size
        self._fed: list[int] = []  # the tokens whose KV the cache holds, in order

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        common = 0
        limit = min(len(self._fed), len(context) - 1)  # the context's last token is always fed again
        while common < limit and self._fed[common] == context[common]:
            common += 1
        self.cache.truncate(common)
        del self._fed[common:]
        if self.cache.max_tokens is not None:
            k = min(k, self.cache.max_tokens - len(context) + 1)  # the cache's room: context + k - 1 tokens
        k = min(k, self.model.config.max_position_embeddings - len(context))  # a shorter context than the target's
        if k <= 0:
            return []
        pending = list(context[common:])
        draft: list[int] = []
        while len(draft) < k:
            logits = self._feed(pending)  # [vocab]
            token = int(np.argmax(logits[: self._vocab]))
            draft.append(token)
            pending = [token]
        return draft

    def _feed(self, tokens: list[int]) -> np.ndarray:
        """Feed ``tokens`` (in chunks) and return the last one's logits [vocab]; ``_fed`` follows the cache."""
        before = self.cache.length
        try:
            return self.model.prefill(self.cache, tokens, self._chunk)  # [vocab]
        finally:
            self._fed.extend(tokens[: self.cache.length - before])  # the chunks fed, even if a later one failed

    def release(self) -> None:
        c = self.cache
        self.cache = KVCache(c.num_layers, c.num_kv_heads, c.head_dim, dtype=c.dtype, max_tokens=0)
        self._fed.clear()


@attrs.define
class SpeculationState:
    """One generation's drafter, draft length and adaptive on/off policy (see the module docstring).

    Attributes:
        drafter: proposes the drafts.
        tokens: the most tokens drafted per verify step (k).
        window: verify steps whose acceptance decides whether drafting pays.
        min_accepted: mean accepted tokens per verify step below which drafting pauses.
        pause: tokens decoded plainly at the first pause; each further pause doubles it.
        max_pause: the longest pause (tokens).
        drafted: tokens drafted so far (all verify steps).
        accepted: drafted tokens accepted so far.
        steps: verify steps so far.
        pauses: times drafting paused.
    """

    drafter: Drafter
    tokens: int
    window: int = 8
    min_accepted: float = 1.0
    pause: int = 16
    max_pause: int = 1024
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    pauses: int = 0
    _recent: collections.deque = attrs.field(init=False)
    _paused_for: int = attrs.field(init=False, default=0)
    _unreported: tuple[int, int, int] = attrs.field(init=False, default=(0, 0, 0))

    def __attrs_post_init__(self) -> None:
        self._recent = collections.deque(maxlen=self.window)

    @property
    def paused(self) -> bool:
        """Whether drafting is paused now (plain decode steps count the pause down)."""
        return self._paused_for > 0

    def propose(self, context: Sequence[int], room: int) -> list[int]:
        """A draft of at most ``min(tokens, room)`` tokens after ``context``; [] while paused.

        Args:
            context: the prompt and the tokens generated so far.
            room: the most tokens worth drafting (what the length limit and the KV reservation leave).
        """
        if self._paused_for > 0 or room <= 0:
            return []
        return self.drafter.propose(context, min(self.tokens, room))[: min(self.tokens, room)]

    def plain_step(self) -> None:
        """Count one plain decode step (one token) against the pause."""
        self._paused_for = max(0, self._paused_for - 1)

    def record(self, drafted: int, accepted: int) -> None:
        """Count one verify step of ``drafted`` tokens, ``accepted`` of them kept; pause when it does not pay."""
        self.drafted += drafted
        self.accepted += accepted
        self.steps += 1
        d, a, s = self._unreported
        self._unreported = (d + drafted, a + accepted, s + 1)
        self._recent.append(accepted)
        if len(self._recent) == self.window and sum(self._recent) < self.min_accepted * self.window:
            self._paused_for = min(self.max_pause, self.pause << min(self.pauses, 20))
            self.pauses += 1
            self._recent.clear()

    def take_counts(self) -> tuple[int, int, int]:
        """(drafted, accepted, verify steps) since the last call: what /metrics has not counted yet."""
        counts, self._unreported = self._unreported, (0, 0, 0)
        return counts
