"""The next-token sampler: logits in, one token id (and its logprobs) out.

Order of processing in :meth:`Sampler.sample` (the order of vLLM and
transformers):

1. ``logit_bias`` is added to the raw logits.
2. ``repetition_penalty`` over every id seen in the prompt or the generation
   (transformers' rule: a positive logit is divided by the penalty, a negative
   one multiplied).
3. ``presence_penalty`` / ``frequency_penalty`` over generated ids only
   (OpenAI's rule: ``logit -= presence * (count > 0) + frequency * count``).
   Then, for structured outputs, the grammar's token mask: every token it
   does not allow gets ``-inf`` (:mod:`kestrel_trio.text.constraints.constraint`), so no
   later step can bring one back.
4. ``temperature == 0`` means greedy: argmax, ties to the lowest id. Otherwise
   the logits are divided by the temperature, then
5. ``top_k`` keeps the k highest logits (and any tied with the k-th),
6. ``top_p`` keeps the smallest most-probable set whose mass reaches top_p,
7. ``min_p`` drops tokens less probable than ``min_p`` times the top one,
8. and one token is drawn from the renormalised softmax of what is left.

Steps 1-3 are :func:`apply_penalties`, steps 4-7 :func:`candidate_probabilities`.

Logprobs (``SamplingParams.logprobs``) are reported from the log-softmax of
the logits after steps 1-3 (and the mask) and before temperature and truncation: the
distribution the request's ``logit_bias``, penalties and grammar define, unaffected by
how it is then sampled. OpenAI documents that logit_bias changes what is
likely and reports logprobs that do not change with temperature; vLLM's V1
default (``logprobs_mode="raw_logprobs"``) differs in one point: it reports
the raw model distribution, before bias and penalties too. Padding rows past
the tokenizer's vocabulary are -inf, so they never appear as alternatives.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from kestrel_trio.errors import BadRequestError
from kestrel_trio.text.sampling.params import SamplingParams
from kestrel_trio.text.speculative import accept_or_resample

__all__ = ["Sampler", "TokenLogprobs", "token_logprobs", "apply_penalties", "candidate_probabilities"]

# Mass within this distance of top_p counts as reaching it, so that float
# rounding in the softmax does not pull in one more token.
_TOP_P_TOLERANCE = 1e-6
# top_p sorts only the most probable 256 (then 4096, ...) tokens when they reach top_p.
_TOP_P_PREFIXES = (256, 4096, 32768)


def apply_penalties(
    logits: np.ndarray, params: SamplingParams, generated_ids: Sequence[int], prompt_ids: Sequence[int]
) -> np.ndarray:
    """Steps 1-3: logit bias, repetition penalty, presence/frequency penalties.

    Args:
        logits: [vocab] raw logits; not modified.
        params: the sampling parameters.
        generated_ids: ids generated so far.
        prompt_ids: the prompt's ids.

    Returns:
        [vocab] float32 logits (a new array when anything applied).
    """
    out = np.asarray(logits, dtype=np.float32)
    copied = False

    def writable() -> np.ndarray:
        nonlocal out, copied
        if not copied:
            out, copied = out.copy(), True
        return out

    if params.logit_bias:
        ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64, count=len(params.logit_bias))
        writable()[ids] += np.fromiter(params.logit_bias.values(), dtype=np.float32, count=len(ids))
    if params.repetition_penalty != 1.0 and (len(prompt_ids) or len(generated_ids)):
        seen = np.unique(np.concatenate([np.asarray(prompt_ids, dtype=np.int64),
                                         np.asarray(generated_ids, dtype=np.int64)]))  # [n_seen]
        selected = writable()[seen]
        penalty = np.float32(params.repetition_penalty)
        out[seen] = np.where(selected > 0, selected / penalty, selected * penalty)
    if (params.presence_penalty or params.frequency_penalty) and len(generated_ids):
        ids, counts = np.unique(np.asarray(generated_ids, dtype=np.int64), return_counts=True)
        writable()[ids] -= (params.presence_penalty + params.frequency_penalty * counts).astype(np.float32)
    return out


def _top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k highest logits and of any tied with the k-th (in id order)."""
    if k <= 0 or k >= logits.size:
        return np.arange(logits.size)
    kth = np.partition(logits, logits.size - k)[logits.size - k]
    return np.flatnonzero(logits >= kth)


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Positions of the smallest most-probable set whose mass reaches top_p."""
    target = top_p - _TOP_P_TOLERANCE
    order = None
    # The nucleus is usually small: sort only the most probable few if they suffice.
    for prefix in _TOP_P_PREFIXES:
        if prefix >= probs.size:
            break
        head = np.argpartition(probs, probs.size - prefix)[-prefix:]
        if probs[head].sum() >= target:
            order = head[np.lexsort((head, -probs[head]))]
            break
    if order is None:
        order = np.argsort(-probs, kind="stable")
    mass_before = np.cumsum(probs[order]) - probs[order]
    return order[: max(1, int(np.count_nonzero(mass_before < target)))]


def candidate_probabilities(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Steps 4-7: the tokens that may be drawn and their probabilities.

    Args:
        logits: [vocab] logits after :func:`apply_penalties`.
        params: the sampling parameters.

    Returns:
        (ids, probs): int64 candidate ids and float64 probabilities summing to 1.
        With temperature 0 this is the single argmax id with probability 1.
    """
    if params.temperature == 0.0:
        return np.array([int(np.argmax(logits))], dtype=np.int64), np.ones(1)
    ids = _top_k(logits, params.top_k)
    scaled = logits[ids].astype(np.float64) / params.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        keep = np.sort(_nucleus(probs, params.top_p))
        ids, probs = ids[keep], probs[keep]
    if params.min_p > 0.0:
        keep = probs >= params.min_p * probs.max()
        ids, probs = ids[keep], probs[keep]
    return ids.astype(np.int64), probs / probs.sum()


@attrs.frozen
class TokenLogprobs:
    """The logprob of one chosen token and the most likely alternatives (natural log).

    Attributes:
        token_id: the chosen token.
        logprob: its log-probability (<= 0).
        top: ``(token_id, logprob)`` of the most likely tokens, most likely
            first (ties: lower id first); as many as requested.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(processed: np.ndarray, token_id: int, top_n: int) -> TokenLogprobs:
    """Logprobs of ``token_id`` and the ``top_n`` most likely tokens under ``processed``.

    Args:
        processed: [vocab] logits after :func:`apply_penalties` (-inf rows allowed).
        token_id: the token that was chosen.
        top_n: alternatives to report (0 for none).
    """
    logits = processed.astype(np.float64)  # [vocab]
    peak = logits.max()
    log_total = peak + np.log(np.exp(logits - peak).sum())
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        count = min(top_n, logits.size)
        head = np.argpartition(-logits, count - 1)[:count]  # [count]
        head = head[np.lexsort((head, -logits[head]))]  # [count] most likely first
        top = tuple((int(i), float(logits[i] - log_total)) for i in head)
    return TokenLogprobs(int(token_id), float(logits[token_id] - log_total), top)


class Sampler:
    """Draws next tokens for one generation; see the module docstring for the order.

    Args:
        params: validated sampling parameters.
        vocab_size: rows of the logits vector (e.g. 151,936 for a padded Qwen3).

    Raises:
        BadRequestError: a logit_bias id is outside the vocabulary.
    """

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        for token_id in params.logit_bias:
            if token_id >= vocab_size:
                raise BadRequestError(f"logit_bias token id {token_id} is outside the vocabulary", param="logit_bias")
        self.params = params
        self.vocab_size = vocab_size
        # numpy wants a non-negative seed; OpenAI allows any int64 (two's complement keeps them distinct).
        self._rng = np.random.default_rng(None if params.seed is None else params.seed & (2**64 - 1))

    def sample(self, logits: np.ndarray, generated_ids: Sequence[int], prompt_ids: Sequence[int],
               allowed: np.ndarray | None = None) -> int:
        """Pick the next token id.

        Args:
            logits: [vocab_size] float32 logits of the next position.
            generated_ids: ids generated so far in this generation.
            prompt_ids: the prompt's ids.
            allowed: bool [vocab_size], the only tokens that may be drawn (a grammar's mask), or None for all.

        Returns:
            The chosen token id.
        """
        return self.sample_scored(logits, generated_ids, prompt_ids, allowed)[0]

    def sample_scored(
        self, logits: np.ndarray, generated_ids: Sequence[int], prompt_ids: Sequence[int],
        allowed: np.ndarray | None = None,
    ) -> tuple[int, TokenLogprobs | None]:
        """Like :meth:`sample`, plus the token's logprobs when ``params.logprobs`` is set.

        Returns:
            (token id, its :class:`TokenLogprobs` or None).
        """
        if logits.shape != (self.vocab_size,):
            raise ValueError(f"expected logits of shape ({self.vocab_size},), got {logits.shape}")
        processed = apply_penalties(logits, self.params, generated_ids, prompt_ids)  # [vocab]
        if allowed is None:
            ids, probs = candidate_probabilities(processed, self.params)
        else:
            # Steps 4-7 over the allowed tokens only: the same draw as over -inf elsewhere, and a grammar
            # usually allows a small part of the vocabulary. Ids stay in order, so ties still go to the lowest.
            allowed_ids = np.flatnonzero(allowed)  # [n_allowed]
            local, probs = candidate_probabilities(processed[allowed_ids], self.params)
            ids = allowed_ids[local]
            if self.params.logprobs is not None:
                processed = np.where(allowed, processed, np.float32(-np.inf))  # [vocab]
        token = self._draw(ids, probs)
        if self.params.logprobs is None:
            return token, None
        return token, token_logprobs(processed, token, self.params.logprobs)

    def sample_draft(self, logits: np.ndarray, generated_ids: Sequence[int], prompt_ids: Sequence[int],
                     draft: int) -> tuple[int, TokenLogprobs | None]:
        """Like :meth:`sample_scored` at a position a deterministic drafter guessed ``draft`` for.

        Speculative sampling (:func:`kestrel_trio.text.speculative.accept_or_resample` with a point-mass
        draft distribution): ``draft`` is kept with its probability under the distribution :meth:`sample`
        draws from, else a token is drawn from that distribution without ``draft``; so the token is
        distributed exactly as :meth:`sample`'s. At temperature 0 it is the argmax, draft or not.

        Returns:
            (token id, its :class:`TokenLogprobs` or None); the draft was accepted iff the id is ``draft``.
        """
        if logits.shape != (self.vocab_size,):
            raise ValueError(f"expected logits of shape ({self.vocab_size},), got {logits.shape}")
        processed = apply_penalties(logits, self.params, generated_ids, prompt_ids)  # [vocab]
        ids, probs = candidate_probabilities(processed, self.params)
        where = np.flatnonzero(ids == draft)
        if ids.size == 1 or where.size == 0:  # greedy, or p(draft) = 0: drawing from p without draft is drawing from p
            token = self._draw(ids, probs)
        else:
            q = np.zeros_like(probs)  # [n] the drafter's point mass
            q[where[0]] = 1.0
            token = int(ids[accept_or_resample(probs, q, int(where[0]), self._rng)])
        if self.params.logprobs is None:
            return token, None
        return token, token_logprobs(processed, token, self.params.logprobs)

    def _draw(self, ids: np.ndarray, probs: np.ndarray) -> int:
        """One id of ``ids`` drawn with ``probs`` (no random number used when there is one candidate)."""
        if ids.size == 1:
            return int(ids[0])
        cdf = np.cumsum(probs)
        pick = int(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"))
        return int(ids[min(pick, ids.size - 1)])
