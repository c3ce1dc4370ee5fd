"""Sampling parameters: what a request may ask of the sampler, validated on construction, and the server's defaults.

:class:`SamplingParams` holds one request's sampling and stopping options (each out-of-range value a
BadRequestError naming its field); :class:`SamplingDefaults` the server-wide defaults a request's own
fields override, and :meth:`SamplingParams.with_defaults` the order in which a request, the server and the
model's generation_config.json fill a field. The sampler that reads them is :mod:`.sampler`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kestrel_trio.errors import BadRequestError
from kestrel_trio.text.repetition import RepetitionGuard

__all__ = ["SamplingParams", "SamplingDefaults", "DEFAULTED_FIELDS"]

MAX_LOGPROBS = 20  # the most alternatives per token any endpoint may ask for (chat top_logprobs)

# Fields whose default may come from a checkpoint's generation_config.json (or a named model's entry),
# and from the server's flags (SamplingDefaults).
DEFAULTED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


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
            raise BadRequestError(f"{attribute.name} must be in {bracket}{low}, {high}], got {value!r}",
                                  param=attribute.name)

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
