"""Which request fields act, which are accepted as harmless no-ops, and which are refused.

Theory of operation: every key of a request body, and of the objects nested
in it, falls in exactly one class:

* acting: read by the parsers, it changes what is generated or returned (the
  parsers pass their own set of these to :func:`check_keys`);
* a no-op (:data:`NO_OP_FIELDS`): accepted, with the values listed there, and
  documented in docs/api.md as having no effect, each with the reason; any
  other value is refused with a 400 naming the field;
* refused (:data:`REFUSED_FIELDS`): a real OpenAI field this server cannot
  honour: a 400 whose ``param`` names it and whose message says why;
* unknown: a 400 "Unrecognized request argument", naming it.

``null`` for an acting, no-op or refused field means unset and is always
accepted (clients send nulls for what they leave unset); an unknown key is
refused whatever its value, so a misspelt field never passes unnoticed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import attrs

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.key_classes import Check, classify_keys
from kestrel_trio.openai.fields.key_classes import is_boolean as _is_boolean
from kestrel_trio.openai.fields.key_classes import is_object as _is_object
from kestrel_trio.openai.fields.key_classes import is_string as _is_string

__all__ = [
    "NoOpField", "NO_OP_FIELDS", "REFUSED_FIELDS", "check_keys", "CHAT", "COMPLETIONS", "TOKENIZE", "DETOKENIZE",
]

# The endpoints, as check_keys and NoOpField.endpoints name them.
CHAT = "chat"  # POST /v1/chat/completions
COMPLETIONS = "completions"  # POST /v1/completions
TOKENIZE = "tokenize"  # POST /tokenize
DETOKENIZE = "detokenize"  # POST /detokenize


@attrs.frozen
class NoOpField:
    """One field accepted without effect.

    Attributes:
        field: its path in generic form (``messages[].name``; ``[]`` stands for any index).
        endpoints: where it is accepted (:data:`CHAT`, :data:`COMPLETIONS`, :data:`TOKENIZE`).
        accepts: the values accepted, in words (any other is refused).
        why: why accepting it changes nothing.
        check: ``check(value, path)`` raises BadRequestError for a value not accepted.
    """

    field: str
    endpoints: frozenset[str]
    accepts: str
    why: str
    check: Check = attrs.field(repr=False)


def _only(*accepted: Any, refusal: str) -> Check:
    """A check accepting exactly the ``accepted`` JSON values; ``refusal`` says why others are refused."""

    def check(value: Any, path: str) -> None:
        if not any(type(value) is type(good) and value == good for good in accepted):
            raise BadRequestError(f"'{path}' {refusal}", param=path)

    return check


_BOTH = frozenset({CHAT, COMPLETIONS})
_CHAT = frozenset({CHAT})
_MESSAGES = frozenset({CHAT, TOKENIZE})

# The one list of fields accepted without effect; docs/api.md shows the same table.
NO_OP_FIELDS: tuple[NoOpField, ...] = (
    NoOpField("user", _BOTH, "a string",
              "an end-user id for OpenAI's abuse monitoring; this server keeps no per-user records", _is_string),
    NoOpField("safety_identifier", _CHAT, "a string", "the newer name of `user`; the same reason", _is_string),
    NoOpField("metadata", _CHAT, "an object", "tags for stored completions; nothing is stored", _is_object),
    NoOpField("store", _CHAT, "a boolean",
              "nothing is ever stored, so there is nothing to retrieve later (no /v1/chat/completions/{id})",
              _is_boolean),
    NoOpField("prompt_cache_key", _CHAT, "a string",
              "the prefix cache is automatic and shared: every prompt that begins like an earlier one reuses its KV",
              _is_string),
    NoOpField("prompt_cache_retention", _CHAT, "a string",
              "cached prompts are kept until --prefix-cache-mb evicts them (least recently used first)", _is_string),
    NoOpField("prompt_cache_options", _CHAT, "an object", "the same as prompt_cache_retention", _is_object),
    NoOpField("service_tier", _CHAT, '"auto" or "default"', "there is one service tier",
              _only("auto", "default", refusal="must be 'auto' or 'default': this server has one service tier")),
    NoOpField("modalities", _CHAT, '["text"]', "text is the only output",
              _only(["text"], refusal="must be [\"text\"]: this server generates text only")),
    NoOpField("verbosity", _CHAT, '"medium"', "OpenAI's default; other values would need the model to follow them",
              _only("medium", refusal="is not supported except 'medium' (the default)")),
    NoOpField("stream_options.include_obfuscation", _BOTH, "false",
              "stream chunks never carry an obfuscation field", _only(False, refusal="is not supported except false: "
                                                                     "stream chunks carry no obfuscation padding")),
    NoOpField("best_of", frozenset({COMPLETIONS}), "1", "each choice is one generation",
              _only(1, refusal="other than 1 is not supported")),
    NoOpField("messages[].name", _MESSAGES, "a string",
              "passed to the chat template, which for Qwen models does not render it", _is_string),
    NoOpField("messages[].content[].image_url.detail", _CHAT, '"auto", "low" or "high"',
              "an image is resized by the model's own rules and --max-image-pixels only",
              _only("auto", "low", "high", refusal="must be 'auto', 'low' or 'high'")),
    NoOpField("tools[].function.strict", _CHAT, "a boolean",
              "the arguments of every tool call are always held to the function's parameters schema "
              "(docs/structured-outputs.md), as strict: true asks", _is_boolean),
)

# Real OpenAI fields that cannot be honoured yet: field (generic path) -> the reason given with the 400.
REFUSED_FIELDS: dict[str, str] = {
    "audio": "audio output is not supported",
    "functions": "legacy function calling is not supported; send 'tools'",
    "function_call": "legacy function calling is not supported; send 'tool_choice'",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "moderation": "moderation is not supported",
    "suffix": "is not supported",
    "messages[].refusal": "is not supported in a request; send the assistant's text as 'content'",
    "messages[].function_call": "legacy function calling is not supported; send 'tool_calls'",
    "messages[].audio": "audio is not supported",
    # Other servers' names for structured output: refused with the name this server takes.
    "guided_json": "is vLLM's older name: send structured_outputs.json (or response_format)",
    "guided_regex": "is vLLM's older name: send structured_outputs.regex",
    "guided_choice": "is vLLM's older name: send structured_outputs.choice",
    "guided_grammar": "is vLLM's older name: send structured_outputs.grammar",
    "grammar": "is llama.cpp's name: send structured_outputs.grammar (GBNF or Lark)",
    "json_schema": "is llama.cpp's name: send response_format {\"type\": \"json_schema\", ...}",
}

_NO_OPS = {(field.field, endpoint): field for field in NO_OP_FIELDS for endpoint in field.endpoints}


def check_keys(obj: dict, acting: Collection[str], *, endpoint: str, path: str = "", generic: str = "") -> None:
    """Refuse every key of ``obj`` that is neither acting, an accepted no-op, nor null and known.

    Args:
        obj: a decoded request object (the body, or an object nested in it).
        acting: the keys its parser reads.
        endpoint: :data:`CHAT`, :data:`COMPLETIONS`, :data:`TOKENIZE` or :data:`DETOKENIZE`: which no-ops apply.
        path: ``obj``'s dotted path in the body (``messages[2]``), ``""`` at top level.
        generic: the same path in generic form (``messages[]``).

    Raises:
        BadRequestError: naming the first offending key (``param`` its full path).
    """
    def no_op_check(field: str) -> Check | None:
        no_op = _NO_OPS.get((field, endpoint))
        return None if no_op is None else no_op.check

    classify_keys(obj, acting, no_op=no_op_check, refused_fields=REFUSED_FIELDS,
                  unknown=lambda full: f"Unrecognized request argument supplied: '{full}'", path=path, generic=generic)
