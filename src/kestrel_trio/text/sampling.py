"""Sampling parameters and the next-token sampler.

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

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from kestrel_trio.errors import BadRequestError
from kestrel_trio.text.repetition import RepetitionGuard
from kestrel_trio.text.speculative import accept_or_resample

__all__ = ["SamplingParams", "SamplingDefaults", "Sampler", "TokenLogprobs", "token_logprobs", "apply_penalties",
           "candidate_probabilities", "DEFAULTED_FIELDS"]

MAX_LOGPROBS = 20  # the most alternatives per token any endpoint may ask for (chat top_logprobs)

# Fields whose default may come from a checkpoint's generation_config.json (or a named model's entry),
# and from the server's flags (SamplingDefaults).
DEFAULTED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Mass within this distance of top_p counts as reaching it, so that float
# rounding in the softmax does not pull in one more token.
_TOP_P_TOLERANCE = 1e-6
# top_p sorts only the most probable 256 (then 4096, ...) tokens when they reach top_p.
_TOP_P_PREFIXES = (256, 4096, 32768)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequestError(f"{name} must be a number, got {value!r}", param=name)
    return float(value)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"{name} must be an integer, got {value!r}", param=name)
    return value


def _in_range(low: float, high: float, *, low_open: bool = False):
    """An attrs validator: a finite number within [low, high] (or (low, high])."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        x = _number(attribute.name, value)
        ok = (low < x if low_open else low <= x) and x <= high
        if not ok:
            bracket = "(" if low_open else "["
            raise BadRequestError(f"{attribute.name} must be in {bracket}{low}, {high}], got {value!r}", param=attribute.name)

    return check


def _check_top_k(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if _integer("top_k", value) < -1:
        raise BadRequestError(f"top_k must be >= 1, or 0 or -1 to disable it, got {value!r}", param="top_k")


def _check_repetition_penalty(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    x = _number("repetition_penalty", value)
    # Logits are divided or multiplied by it: outside this range float32 logits overflow or vanish.
    if not (_REPETITION_PENALTY_RANGE[0] <= x <= _REPETITION_PENALTY_RANGE[1]):
        low, high = _REPETITION_PENALTY_RANGE
        raise BadRequestError(f"repetition_penalty must be from {low:g} to {high:g}, got {value!r}",
                              param="repetition_penalty")


_REPETITION_PENALTY_RANGE = (0.01, 100.0)


def _check_logit_bias(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    for token_id, bias in value.items():
        if _integer("logit_bias", token_id) < 0:
            raise BadRequestError(f"logit_bias token id {token_id} is negative", param="logit_bias")
        if not -100 <= _number("logit_bias", bias) <= 100:
            raise BadRequestError(f"logit_bias values must be in [-100, 100], got {bias!r}", param="logit_bias")


def _check_optional_int(minimum: int | None):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None:
            return
        number = _integer(attribute.name, value)
        if minimum is not None and number < minimum:
            raise BadRequestError(f"{attribute.name} must be >= {minimum}, got {value!r}", param=attribute.name)

    return check


def _check_stop(instance: Any, attribute: attrs.Attribute, value: tuple) -> None:
    for stop in value:
        if not isinstance(stop, str) or not stop:
            raise BadRequestError(f"stop strings must be non-empty strings, got {stop!r}", param="stop")


def _check_stop_token_ids(instance: Any, attribute: attrs.Attribute, value: tuple) -> None:
    for token_id in value:
        if _integer("stop_token_ids", token_id) < 0:
            raise BadRequestError(f"stop_token_ids must be >= 0, got {token_id!r}", param="stop_token_ids")


def _check_guard(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, RepetitionGuard):
        raise BadRequestError(f"repetition_guard must be a RepetitionGuard or None, got {value!r}",
                              param="repetition_guard")


def _check_bool(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise BadRequestError(f"{attribute.name} must be a boolean, got {value!r}", param=attribute.name)


def _check_logprobs(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not 0 <= _integer("logprobs", value) <= MAX_LOGPROBS:
        raise BadRequestError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {value!r}", param="logprobs")


def _to_tuple(value: Any) -> tuple:
    """A str stays one item (OpenAI's ``stop`` may be a single string)."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes, int)):
        return (value,)
    return tuple(value)


def _to_logit_bias(value: Any) -> dict:
    """OpenAI sends logit_bias keys as strings of token ids."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadRequestError("logit_bias must be an object mapping token ids to biases", param="logit_bias")
    bias = {}
    for key, item in value.items():
        try:
            token_id = int(key) if isinstance(key, str) else key
        except ValueError:
            raise BadRequestError(f"logit_bias key {key!r} is not a token id", param="logit_bias") from None
        bias[token_id] = item
    return bias


@attrs.frozen
class SamplingParams:
    """How to pick tokens and when to stop; validated on construction.

    Attributes:
        temperature: softmax temperature in [0, 2]; 0 means greedy.
        top_k: keep the k most likely tokens; 0 or -1 disables it.
        top_p: nucleus mass in (0, 1]; 1 disables it.
        min_p: in [0, 1]; drop tokens below min_p times the top probability.
        repetition_penalty: > 0; 1 is neutral.
        presence_penalty: in [-2, 2]; 0 is neutral.
        frequency_penalty: in [-2, 2]; 0 is neutral.
        logit_bias: token id -> bias in [-100, 100], added to the logits.
        seed: seeds the sampler's generator; ``None`` uses OS entropy.
        max_tokens: at most this many generated tokens (>= 1), or ``None``.
        stop: strings that end the generation (never emitted).
        stop_token_ids: ids that end the generation besides the EOS ids.
        ignore_eos: keep generating past EOS tokens.
        logprobs: report each chosen token's logprob and this many most likely
            alternatives (0 to 20); ``None`` reports none.
        repetition_guard: end the generation (finish_reason "length") once its
            last tokens repeat one cycle (:class:`~kestrel_trio.text.repetition.RepetitionGuard`);
            ``None``: no guard.

    Raises:
        BadRequestError: a value is out of range; ``param`` names the field.
    """

    temperature: float = attrs.field(default=1.0, validator=_in_range(0.0, 2.0))
    top_k: int = attrs.field(default=0, validator=_check_top_k)
    top_p: float = attrs.field(default=1.0, validator=_in_range(0.0, 1.0, low_open=True))
    min_p: float = attrs.field(default=0.0, validator=_in_range(0.0, 1.0))
    repetition_penalty: float = attrs.field(default=1.0, validator=_check_repetition_penalty)
    presence_penalty: float = attrs.field(default=0.0, validator=_in_range(-2.0, 2.0))
    frequency_penalty: float = attrs.field(default=0.0, validator=_in_range(-2.0, 2.0))
    logit_bias: dict[int, float] = attrs.field(
        factory=dict, converter=_to_logit_bias, validator=_check_logit_bias, hash=False
    )
    seed: int | None = attrs.field(default=None, validator=_check_optional_int(None))
    max_tokens: int | None = attrs.field(default=None, validator=_check_optional_int(1))
    stop: tuple[str, ...] = attrs.field(default=(), converter=_to_tuple, validator=_check_stop)
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=_to_tuple, validator=_check_stop_token_ids)
    ignore_eos: bool = attrs.field(default=False, validator=_check_bool)
    logprobs: int | None = attrs.field(default=None, validator=_check_logprobs)
    repetition_guard: RepetitionGuard | None = attrs.field(default=None, validator=_check_guard)

    @classmethod
    def with_defaults(cls, request_fields: Mapping[str, Any], generation_defaults: Mapping[str, Any],
                      server: SamplingDefaults | None = None) -> SamplingParams:
        """Params from a request, unset fields filled from the server's and the model's defaults.

        Precedence: the request's value; else the server's default
        (``server``: ``serve --temperature`` ...); else, for temperature,
        top_p, top_k, min_p and repetition_penalty, the model's
        (generation_config.json's value, whose ``do_sample: false`` means a
        default temperature of 0, i.e. greedy; or a named model's entry);
        else the library default (temperature 1, top_p 1, top_k off, min_p 0,
        neutral penalties, no repetition guard).

        Args:
            request_fields: SamplingParams field names -> request values; a
                value of ``None`` counts as unset (OpenAI clients send nulls).
            generation_defaults: ``Model.generation_defaults`` (a checkpoint's
                ``Tokenizer.generation_defaults``).
            server: the server-wide defaults, or None.

        Raises:
            TypeError: a key is not a SamplingParams field.
            BadRequestError: a value is invalid (``param`` names it).
        """
        known = {field.name for field in attrs.fields(cls)}
        unknown = sorted(set(request_fields) - known)
        if unknown:
            raise TypeError(f"not SamplingParams fields: {', '.join(unknown)}")
        values = {name: value for name, value in request_fields.items() if value is not None}
        checkpoint = {
            name: generation_defaults[name] for name in DEFAULTED_FIELDS if generation_defaults.get(name) is not None
        }
        if generation_defaults.get("do_sample") is False:
            checkpoint["temperature"] = 0.0
        served = server.as_dict() if server is not None else {}
        return cls(**{**checkpoint, **served, **values})


def _check_default(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A server default is checked by SamplingParams' own validator: one range, one message."""
    if value is not None:
        SamplingParams(**{attribute.name: value})


@attrs.frozen
class SamplingDefaults:
    """Server-wide sampling defaults (``serve --temperature`` ...): a request's own field wins over each.

    ``None`` leaves a field to the model's default (its generation_config.json, or a named
    model's entry), else the library's (temperature 1, top_p 1, top_k off, min_p 0, no penalty).

    Attributes:
        temperature: softmax temperature, 0 to 2; 0 is greedy.
        top_p: nucleus mass, above 0 and at most 1 (1: off).
        top_k: keep the k most likely tokens (0 or -1: off).
        min_p: drop tokens less probable than min_p times the most likely one, 0 to 1 (0: off).
        repetition_penalty: divides the positive logits (multiplies the negative ones) of every token
            already in the prompt or the output, 0.01 to 100 (1: off; llama.cpp's ``--repeat-penalty``,
            applied over the whole sequence as transformers and vLLM do).
        repetition_guard: end generations that loop (:class:`~kestrel_trio.text.repetition.RepetitionGuard`;
            None: no guard).

    Raises:
        BadRequestError: a value out of range (``param`` names the field).
    """

    temperature: float | None = attrs.field(default=None, validator=_check_default)
    top_p: float | None = attrs.field(default=None, validator=_check_default)
    top_k: int | None = attrs.field(default=None, validator=_check_default)
    min_p: float | None = attrs.field(default=None, validator=_check_default)
    repetition_penalty: float | None = attrs.field(default=None, validator=_check_default)
    repetition_guard: RepetitionGuard | None = attrs.field(default=None, validator=_check_default)

    def as_dict(self) -> dict[str, Any]:
        """The fields set, by name."""
        return {name: value for name, value in attrs.asdict(self, recurse=False).items() if value is not None}


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
        seen = np.unique(np.concatenate([np.asarray(prompt_ids, dtype=np.int64), np.asarray(generated_ids, dtype=np.int64)]))
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
