"""The sampling fields shared by ``/v1/chat/completions`` and ``/v1/completions``.

Only types, presence and structure are checked here (plus ``max_tokens >= 1``,
``n >= 1``, at most 4 stop strings); value ranges such as ``temperature`` in
[0, 2] are checked later against the model's limits.
"""

from __future__ import annotations

import re
import attrs

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import (
    check_token_id,
    fail,
    get_array,
    get_bool,
    get_int,
    get_number,
    get_object,
    join_path,
)
from kestrel_trio.openai.request.accepted_fields import CHAT, COMPLETIONS, check_keys

__all__ = [
    "SamplingFields", "parse_sampling_fields", "SAMPLING_KEYS_CHAT", "SAMPLING_KEYS_COMPLETIONS",
    "COMPLETIONS_DEFAULT_MAX_TOKENS", "default_max_tokens",
]

MAX_STOP_SEQUENCES = 4
MAX_N = 8  # choices per request; each is a full generation, so keep it small
MAX_TOP_LOGPROBS_CHAT = 20  # OpenAI's bounds
MAX_LOGPROBS_COMPLETIONS = 5
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions without max_tokens
_TOKEN_ID_KEY = re.compile(r"[0-9]+")
# The body keys parse_sampling_fields reads, on each endpoint.
SAMPLING_KEYS_COMPLETIONS = frozenset({
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "logit_bias", "n", "stream", "stream_options",
    "ignore_eos", "logprobs", "repetition_guard",
})
SAMPLING_KEYS_CHAT = SAMPLING_KEYS_COMPLETIONS | {"max_completion_tokens", "top_logprobs"}


@attrs.frozen
class SamplingFields:
    """Sampling-related request fields; ``None`` means the request did not set it.

    Attributes:
        max_tokens: cap on generated tokens (``max_completion_tokens`` wins over
            ``max_tokens`` on the chat endpoint).
        max_tokens_param: the field that set ``max_tokens``, for error messages.
        temperature, top_p, min_p: as in OpenAI / vLLM (``min_p`` is a vLLM extension).
        top_k: vLLM extension.
        presence_penalty, frequency_penalty: OpenAI additive penalties.
        repetition_penalty: vLLM (multiplicative) extension.
        seed: RNG seed.
        stop: stop strings (at most 4, none empty).
        stop_token_ids: vLLM extension; token ids that end generation.
        logit_bias: ``(token_id, bias)`` pairs in request order.
        n: number of choices, 1 to :data:`MAX_N`.
        logprobs: report logprobs with this many alternatives per token (chat:
            ``top_logprobs`` when ``logprobs`` is true; completions: the
            integer ``logprobs``); None when not asked for.
        stream: answer with server-sent events.
        include_usage: ``stream_options.include_usage``.
        ignore_eos: vLLM extension; keep generating past end-of-sequence tokens.
        repetition_guard: kestrel extension; ``(window, repeats)``: end the generation once its last
            ``window`` tokens repeat one cycle ``repeats`` times (ranges checked with the model's
            limits); False: no guard, whatever the server's default; None: the server's default.
    """

    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    repetition_guard: tuple[int, int] | bool | None = None

    def as_dict(self) -> dict:
        """The fields the request set, by name, for merging over model defaults.

        A field counts as set when it differs from its unset value (``None``,
        an empty tuple, ``n == 1``, ``False``).
        """
        return {
            field.name: value
            for field in attrs.fields(type(self))
            if (value := getattr(self, field.name)) != field.default
        }


def parse_sampling_fields(body: dict, *, chat: bool) -> SamplingFields:
    """Read the sampling fields of a decoded request body.

    Args:
        body: the decoded top-level request object.
        chat: True for the chat endpoint, which also knows ``max_completion_tokens``.

    Raises:
        BadRequestError: naming the first offending field.
    """
    stream = bool(get_bool(body, "stream"))
    max_tokens, max_tokens_param = _max_tokens(body, chat)
    return SamplingFields(
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        temperature=get_number(body, "temperature"),
        top_p=get_number(body, "top_p"),
        top_k=get_int(body, "top_k"),
        min_p=get_number(body, "min_p"),
        presence_penalty=get_number(body, "presence_penalty"),
        frequency_penalty=get_number(body, "frequency_penalty"),
        repetition_penalty=get_number(body, "repetition_penalty"),
        seed=get_int(body, "seed"),
        stop=_stop(body),
        stop_token_ids=_stop_token_ids(body),
        logit_bias=_logit_bias(body),
        n=_n(body),
        stream=stream,
        include_usage=_include_usage(body, stream, chat),
        ignore_eos=bool(get_bool(body, "ignore_eos")),
        logprobs=_chat_logprobs(body) if chat else _completion_logprobs(body),
        repetition_guard=_repetition_guard(body, chat),
    )


def default_max_tokens(*, chat: bool, server_cap: int | None) -> int | None:
    """The most new tokens of a request that set no ``max_tokens`` (nor ``max_completion_tokens``).

    OpenAI's defaults, under the server's cap (``serve --default-max-tokens``): chat generates up to
    the context (or ``server_cap``); completions generate :data:`COMPLETIONS_DEFAULT_MAX_TOKENS`
    tokens, or ``server_cap`` when that is lower. The cap never raises a default; a request's own
    ``max_tokens`` is never capped by it.

    Args:
        chat: the chat endpoint (else completions).
        server_cap: the server-wide default cap in tokens, or None.

    Returns:
        The default in tokens, or None for "as many as the context allows".
    """
    if chat:
        return server_cap
    if server_cap is None:
        return COMPLETIONS_DEFAULT_MAX_TOKENS
    return min(COMPLETIONS_DEFAULT_MAX_TOKENS, server_cap)


def _max_tokens(body: dict, chat: bool) -> tuple[int | None, str]:
    """The cap on new tokens and the field it came from."""
    legacy = _at_least_one(body, "max_tokens")
    if chat:
        preferred = _at_least_one(body, "max_completion_tokens")
        if preferred is not None:
            return preferred, "max_completion_tokens"
    return legacy, "max_tokens"


def _at_least_one(body: dict, key: str) -> int | None:
    value = get_int(body, key)
    if value is not None and value < 1:
        raise BadRequestError(f"'{key}' must be at least 1, got {value}", param=key)
    return value


def _n(body: dict) -> int:
    n = get_int(body, "n")
    if n is None:
        return 1
    if n < 1:
        raise BadRequestError(f"'n' must be at least 1, got {n}", param="n")
    if n > MAX_N:
        raise BadRequestError(f"'n' must be at most {MAX_N}, got {n}", param="n")
    return n


def _chat_logprobs(body: dict) -> int | None:
    wanted = get_bool(body, "logprobs")
    top = get_int(body, "top_logprobs")
    if top is not None:
        if not wanted:
            raise BadRequestError("'top_logprobs' needs 'logprobs' set to true", param="top_logprobs")
        if not 0 <= top <= MAX_TOP_LOGPROBS_CHAT:
            raise BadRequestError(f"'top_logprobs' must be in [0, {MAX_TOP_LOGPROBS_CHAT}], got {top}",
                                  param="top_logprobs")
    return (top or 0) if wanted else None


def _completion_logprobs(body: dict) -> int | None:
    value = body.get("logprobs")
    if value is None or value is False:  # some clients send false for "off"
        return None
    count = get_int(body, "logprobs")
    if not 0 <= count <= MAX_LOGPROBS_COMPLETIONS:
        raise BadRequestError(f"'logprobs' must be in [0, {MAX_LOGPROBS_COMPLETIONS}], got {count}", param="logprobs")
    return count


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        items: list = [value]
    elif isinstance(value, list):
        if len(value) > MAX_STOP_SEQUENCES:
            raise BadRequestError(
                f"'stop' may hold at most {MAX_STOP_SEQUENCES} sequences, got {len(value)}", param="stop"
            )
        items = value
    else:
        raise fail("stop", "a string or an array of strings", value)
    for i, item in enumerate(items):
        path = "stop" if isinstance(value, str) else join_path("stop", i)
        if not isinstance(item, str):
            raise fail(path, "a string", item)
        if not item:
            raise BadRequestError(f"'{path}' must not be an empty string", param=path)
    return tuple(items)


def _repetition_guard(body: dict, chat: bool) -> tuple[int, int] | bool | None:
    """``{"window": N, "repeats": K}`` as ``(N, K)``, ``false`` as False (off), absent or null as None."""
    value = body.get("repetition_guard")
    if value is None or value is False:
        return value
    if not isinstance(value, dict):
        raise fail("repetition_guard", 'false or an object {"window": tokens, "repeats": count}', value)
    check_keys(value, ("window", "repeats"), endpoint=CHAT if chat else COMPLETIONS, path="repetition_guard",
               generic="repetition_guard")
    window = get_int(value, "window", "repetition_guard")
    repeats = get_int(value, "repeats", "repetition_guard")
    for key, number in (("window", window), ("repeats", repeats)):
        if number is None:
            raise fail(join_path("repetition_guard", key), "an integer", None)
    return window, repeats


def _stop_token_ids(body: dict) -> tuple[int, ...]:
    items = get_array(body, "stop_token_ids") or []
    return tuple(check_token_id(item, join_path("stop_token_ids", i)) for i, item in enumerate(items))


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    bias = get_object(body, "logit_bias")
    if bias is None:
        return ()
    pairs: dict[int, float] = {}
    for key in bias:
        path = join_path("logit_bias", key)
        if not _TOKEN_ID_KEY.fullmatch(key):
            raise BadRequestError(f"'logit_bias' keys must be token ids (non-negative integers); got {key!r}", param=path)
        token = int(key)
        if token in pairs:
            raise BadRequestError(f"'logit_bias' names token {token} more than once", param=path)
        value = get_number(bias, key, "logit_bias")
        if value is None:
            raise fail(path, "a number", None)
        pairs[token] = value
    return tuple(pairs.items())


def _include_usage(body: dict, stream: bool, chat: bool) -> bool:
    options = get_object(body, "stream_options")
    if options is None:
        return False
    if not stream:
        raise BadRequestError("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    check_keys(options, ("include_usage",), endpoint=CHAT if chat else COMPLETIONS, path="stream_options",
               generic="stream_options")
    return bool(get_bool(options, "include_usage", "stream_options"))
