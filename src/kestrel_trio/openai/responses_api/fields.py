"""Which keys a Responses API request may carry: acting, accepted as documented no-ops, or refused.

Theory of operation: as for chat completions (:mod:`kestrel_trio.openai.request.accepted_fields`), every key of a
``POST /v1/responses`` body and of the objects nested in it falls in one class: acting (read by the parser,
which passes its own set to :func:`check_keys`), a no-op (:data:`NO_OP_FIELDS`: accepted with the values
listed, documented in docs/responses.md), refused (:data:`REFUSED_FIELDS`: a real field this stateless
server cannot honour, a 400 saying why), or unknown (a 400 "Unrecognized request argument", naming it).
``null`` for a known field means unset.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import check_str, fail, join_path
from kestrel_trio.openai.fields.key_classes import Check, checks_of, classify_keys
from kestrel_trio.openai.fields.key_classes import is_array as _array
from kestrel_trio.openai.fields.key_classes import is_boolean as _boolean
from kestrel_trio.openai.fields.key_classes import is_string as _string
from kestrel_trio.openai.fields.key_classes import one_of as _one_of

__all__ = ["NO_OP_FIELDS", "REFUSED_FIELDS", "check_keys"]


def _include(value: Any, path: str) -> None:
    if not isinstance(value, list):
        raise fail(path, "an array", value)
    for i, item in enumerate(value):
        item_path = join_path(path, i)
        if check_str(item, item_path) != "reasoning.encrypted_content":
            raise BadRequestError(f"'{item_path}' {item!r} is not supported; this server can include only "
                                  "'reasoning.encrypted_content' (a no-op: reasoning is returned as plain text)",
                                  param=item_path)


# generic path -> (the values accepted, in words; why accepting it changes nothing; the value check).
NO_OP_FIELDS: dict[str, tuple[str, str, Check]] = {
    "store": ("a boolean", "nothing is stored, whatever the value: every response is answered and forgotten "
              "(the response reports store: false)", _boolean),
    "user": ("a string", "an end-user id for OpenAI's abuse monitoring; no per-user records are kept", _string),
    "safety_identifier": ("a string", "the newer name of user; the same reason", _string),
    "prompt_cache_key": ("a string", "the prefix cache is automatic: a prompt that begins like an earlier one "
                         "reuses its KV", _string),
    "prompt_cache_retention": ('"in_memory" or "24h"', "cached prompts stay until --prefix-cache-mb evicts them",
                               _one_of("in_memory", "24h")),
    "service_tier": ('"auto" or "default"', "there is one service tier", _one_of("auto", "default")),
    "background": ("false", "every response runs in the foreground", _one_of(False)),
    "truncation": ('"disabled"', "OpenAI's default: an input too long for the context is a 400",
                   _one_of("disabled")),
    "include": ('[] or ["reasoning.encrypted_content"]', "reasoning is returned as plain text in the reasoning "
                "item's content; there is no encrypted form to include", _include),
    "stream_options.include_obfuscation": ("false", "events carry no obfuscation padding", _one_of(False)),
    "reasoning.summary": ('"auto", "concise" or "detailed"', "no summaries are written; the reasoning itself is "
                          "returned in the reasoning item's content", _one_of("auto", "concise", "detailed")),
    "reasoning.generate_summary": ('"auto", "concise" or "detailed"', "the older name of reasoning.summary",
                                   _one_of("auto", "concise", "detailed")),
    "text.verbosity": ('"medium"', "OpenAI's default; other values would need the model to follow them",
                       _one_of("medium")),
    "tools[].strict": ("a boolean", "a call's arguments are always held to the function's parameters schema, as "
                       "strict: true asks", _boolean),
    "input[].id": ("a string", "an output item's id, sent back with it; nothing refers to it here", _string),
    "input[].status": ('"in_progress", "completed" or "incomplete"', "an output item's status, sent back with it",
                       _one_of("in_progress", "completed", "incomplete")),
    "input[].content[].annotations": ("an array", "output text's annotations (always empty here)", _array),
    "input[].content[].logprobs": ("an array", "output text's logprobs, sent back with it", _array),
    "input[].content[].detail": ('"auto", "low" or "high"', "an image is resized by the model's own rules and "
                                 "--max-image-pixels only", _one_of("auto", "low", "high")),
    "input[].summary": ("an array", "a reasoning item's summaries (this server writes none)", _array),
    "input[].encrypted_content": ("a string", "a reasoning item's encrypted form (this server writes none)",
                                  _string),
}

_STATELESS = "this server is stateless: it stores no responses or conversations; send the whole conversation " \
    "in 'input'"
# generic path -> why it is refused.
REFUSED_FIELDS: dict[str, str] = {
    "previous_response_id": _STATELESS,
    "conversation": _STATELESS,
    "prompt": "stored prompt templates are not supported; send 'instructions' and 'input'",
    "context_management": "server-side compaction is not supported",
    "max_tool_calls": "is not supported; limit calls with 'parallel_tool_calls': false or 'tool_choice'",
    "top_logprobs": "is not supported on /v1/responses; use /v1/chat/completions with logprobs",
    "moderation": "moderation is not supported",
    "access_programs": "is not supported",
    "prompt_cache_options": "is not supported; the prefix cache is automatic",
    "image": "image generation is not supported",
    "background_options": "background responses are not supported",
}


def check_keys(obj: dict, acting: Collection[str], *, path: str = "", generic: str = "") -> None:
    """Refuse every key of ``obj`` that is neither acting, an accepted no-op, nor null and known.

    Args:
        obj: a decoded request object (the body, or an object nested in it).
        acting: the keys its parser reads.
        path: ``obj``'s dotted path in the body (``input[2]``), ``""`` at top level.
        generic: the same path in generic form (``input[]``).

    Raises:
        BadRequestError: naming the first offending key.
    """
    classify_keys(obj, acting, no_op=checks_of(NO_OP_FIELDS), refused_fields=REFUSED_FIELDS,
                  unknown=lambda full: f"Unrecognized request argument supplied: '{full}'", path=path, generic=generic)

