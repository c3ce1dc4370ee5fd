"""Ollama's ``options`` object -> the server's sampling fields (no trio, no numpy).

Each key Ollama's documentation lists gets one of three treatments, and nothing is silently ignored:

* acted on: ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``num_predict`` (max tokens; -1 and
  -2 mean "until the end of the context" as Ollama's do), ``stop``, ``repeat_penalty`` (multiplicative,
  over the prompt and the answer), ``presence_penalty``, ``frequency_penalty``.
* documented no-ops, :data:`RUNTIME_OPTIONS`: how the runner is loaded and laid out (``num_ctx``,
  ``num_thread``, ``num_gpu``, ``use_mmap`` ...), which this server fixes at start (``serve --max-model-len``,
  ``--blas-threads`` ...); they are accepted so that clients which always send them work, and the context a
  request gets is the served one (``/api/show`` reports it).
* refused with a 400 naming the key unless it has its neutral value, :data:`NEUTRAL_ONLY`: samplers this
  server does not implement (``mirostat``, ``typical_p``, ``tfs_z``, ``repeat_last_n`` other than -1,
  ``penalize_newline``). ``mirostat_tau`` and ``mirostat_eta`` only tune mirostat: a number is accepted, and
  changes nothing, since mirostat is always off.
"""

from __future__ import annotations

from typing import Any

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai import SamplingFields
from kestrel_trio.openai.fields.access import check_object, check_str, fail, get_int, get_number, join_path

__all__ = ["sampling_from_options", "RUNTIME_OPTIONS", "NEUTRAL_ONLY", "MAX_STOP"]

MAX_STOP = 16  # each stop string is matched against every generated character
RUNTIME_OPTIONS = frozenset({
    "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap",
    "use_mlock", "embedding_only", "num_thread", "numa", "num_keep", "rope_frequency_base", "rope_frequency_scale",
    "num_gqa", "gpu_split",
})
NEUTRAL_ONLY = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0, "repeat_last_n": -1, "penalize_newline": False}
_MIROSTAT_TUNING = ("mirostat_tau", "mirostat_eta")  # tune mirostat only: nothing to tune while it is off
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "num_predict", "stop", "repeat_penalty",
             "presence_penalty", "frequency_penalty")


def sampling_from_options(value: Any, *, stream: bool, param: str = "options") -> SamplingFields:
    """The sampling fields of an ``options`` object (None: the server's and model's defaults).

    Raises:
        BadRequestError: an unknown key, a value of the wrong type or range, or a sampler this server does
            not implement set to anything but its neutral value (``param`` names the key).
    """
    options = {} if value is None else check_object(value, param)
    for key, item in options.items():
        path = join_path(param, key)
        if key in _SAMPLING or key in RUNTIME_OPTIONS or item is None:
            continue
        if key in _MIROSTAT_TUNING:
            get_number(options, key, param)  # a number, which changes nothing while mirostat is off (refused on)
            continue
        if key in NEUTRAL_ONLY:
            neutral = NEUTRAL_ONLY[key]
            if item != neutral:
                raise BadRequestError(f"'{path}': this server does not implement it (only {neutral!r}, the neutral "
                                      "value, is accepted); use temperature, top_p, top_k, min_p or repeat_penalty",
                                      param=path)
            continue
        raise BadRequestError(f"'{path}' is not an option this server knows (sampling: {', '.join(_SAMPLING)})",
                              param=path)
    max_tokens = get_int(options, "num_predict", param)
    if max_tokens is not None and max_tokens < 0:
        if max_tokens not in (-1, -2):
            raise BadRequestError(f"'{param}.num_predict' must be positive, -1 or -2; got {max_tokens}",
                                  param=f"{param}.num_predict")
        max_tokens = None  # -1: no limit, -2: fill the context; both end at the context's end here
    elif max_tokens == 0:
        raise BadRequestError(f"'{param}.num_predict' must be positive, -1 or -2; got 0", param=f"{param}.num_predict")
    temperature = get_number(options, "temperature", param)
    if temperature is not None and temperature < 0:
        raise BadRequestError(f"'{param}.temperature' must be at least 0, got {temperature}",
                              param=f"{param}.temperature")
    return SamplingFields(
        max_tokens=max_tokens, max_tokens_param=f"{param}.num_predict", temperature=temperature,
        top_p=_in_unit(options, "top_p", param), top_k=_top_k(options, param), min_p=_in_unit(options, "min_p", param),
        presence_penalty=get_number(options, "presence_penalty", param),
        frequency_penalty=get_number(options, "frequency_penalty", param),
        repetition_penalty=_positive(options, "repeat_penalty", param), seed=get_int(options, "seed", param),
        stop=_stop(options.get("stop"), join_path(param, "stop")), stream=stream)


def _in_unit(options: dict, key: str, param: str) -> float | None:
    value = get_number(options, key, param)
    if value is not None and not 0.0 <= value <= 1.0:
        raise BadRequestError(f"'{param}.{key}' must be in [0, 1], got {value}", param=f"{param}.{key}")
    return value


def _positive(options: dict, key: str, param: str) -> float | None:
    value = get_number(options, key, param)
    if value is not None and value <= 0:
        raise BadRequestError(f"'{param}.{key}' must be greater than 0, got {value}", param=f"{param}.{key}")
    return value


def _top_k(options: dict, param: str) -> int | None:
    value = get_int(options, "top_k", param)
    if value is None or value > 0:
        return value
    if value == 0:
        return None  # Ollama's 0: no top-k cut
    raise BadRequestError(f"'{param}.top_k' must be at least 0, got {value}", param=f"{param}.top_k")


def _stop(value: Any, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise fail(path, "a string or an array of strings", value)
    if len(value) > MAX_STOP:
        raise BadRequestError(f"'{path}' may hold at most {MAX_STOP} strings, got {len(value)}", param=path)
    out = []
    for i, item in enumerate(value):
        text = check_str(item, join_path(path, i))
        if not text:
            raise BadRequestError(f"'{join_path(path, i)}' must not be empty", param=join_path(path, i))
        out.append(text)
    return tuple(out)
