"""Which keys an Anthropic Messages request may carry: acting, accepted as documented no-ops, or refused.

Theory of operation: as for the OpenAI routes (:mod:`kestrel_trio.openai.request.accepted_fields`), every key of a
request body and of the objects nested in it falls in one class: acting (read by the parsers, which pass
their own set to :func:`check_keys`), a no-op (:data:`NO_OP_FIELDS`: accepted with the values listed and
documented in docs/anthropic.md), refused (:data:`REFUSED_FIELDS`: a real Anthropic field this server cannot
honour, a 400 saying why), or unknown (a 400 naming it, in Anthropic's words: "Extra inputs are not
permitted"). ``null`` for a known field means unset.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import check_str
from kestrel_trio.openai.fields.key_classes import Check, checks_of, classify_keys
from kestrel_trio.openai.fields.key_classes import is_object as _object
from kestrel_trio.openai.fields.key_classes import is_string as _string

__all__ = ["NO_OP_FIELDS", "REFUSED_FIELDS", "check_keys"]


def _one_of(*accepted: str) -> Check:
    def check(value: Any, path: str) -> None:
        if check_str(value, path) not in accepted:
            raise BadRequestError(f"'{path}' must be one of {', '.join(accepted)}; got {value!r}", param=path)

    return check


def _thinking_keep(value: Any, path: str) -> None:
    if value == "all":
        return
    if not (isinstance(value, dict) and value.get("type") == "thinking_turns" and set(value) == {"type", "value"}
            and isinstance(value["value"], int) and not isinstance(value["value"], bool) and value["value"] >= 1):
        raise BadRequestError(f"'{path}' must be \"all\" or {{\"type\": \"thinking_turns\", \"value\": n >= 1}}; "
                              f"got {value!r}", param=path)


# generic path -> (the values accepted, in words; why accepting it changes nothing; the value check).
NO_OP_FIELDS: dict[str, tuple[str, str, Check]] = {
    "metadata": ("an object", "tags such as user_id for Anthropic's abuse monitoring; no per-user records are kept",
                 _object),
    "service_tier": ('"auto" or "standard_only"', "there is one service tier", _one_of("auto", "standard_only")),
    "cache_control": ("an object", "the prefix cache is automatic: a prompt that begins like an earlier one "
                      "reuses its KV, with or without breakpoints", _object),
    "speed": ('"standard" or "fast"', "there is one speed: the engine always runs as fast as it can",
              _one_of("standard", "fast")),
    "inference_geo": ("a string", "the answer is computed where this server runs", _string),
    "diagnostics": ("an object", "prompt-cache miss reports are not produced", _object),
    "user_profile_id": ("a string", "no per-user records are kept", _string),
    "workspace_id": ("a string", "there are no workspaces", _string),
    "output_config.effort": ('"low", "medium", "high", "xhigh" or "max"', "the served model has no effort levels; "
                             "switch its reasoning with 'thinking'",
                             _one_of("low", "medium", "high", "xhigh", "max")),
    "thinking.display": ('"summarized"', "reasoning is returned as the model wrote it",
                         _one_of("summarized")),
    "system[].cache_control": ("an object", "the prefix cache is automatic: a prompt that begins like an earlier "
                               "one reuses its KV whatever the breakpoints", _object),
    "messages[].content[].cache_control": ("an object", "the same as system[].cache_control", _object),
    "tools[].cache_control": ("an object", "the same as system[].cache_control", _object),
    "context_management.edits[].keep": ('"all" or {"type": "thinking_turns", "value": n}', "the edit is "
                                        "clear_thinking_20251015: earlier reasoning sent back is rendered as the "
                                        "model's template renders it (Qwen3's keeps the current turn's only)",
                                        _thinking_keep),
    "messages[].content[].signature": ("a string", "thinking blocks sent back are rendered as earlier reasoning; "
                                       "there is no signature to verify", _string),
}

# generic path -> why it is refused.
REFUSED_FIELDS: dict[str, str] = {
    "container": "code-execution containers are not supported",
    "mcp_servers": "MCP connectors are not supported; run the MCP client yourself and send its tools in 'tools'",
    "output_format": "is not supported; constrain JSON through a tool with tool_choice {\"type\": \"tool\"}",
    "output_config.format": "is not supported; constrain JSON through a tool with tool_choice {\"type\": \"tool\"}",
    "messages[].content[].citations": "citations are not supported",
    "system[].citations": "citations are not supported",
}


def check_keys(obj: dict, acting: Collection[str], *, path: str = "", generic: str = "") -> None:
    """Refuse every key of ``obj`` that is neither acting, an accepted no-op, nor null and known.

    Args:
        obj: a decoded request object (the body, or an object nested in it).
        acting: the keys its parser reads.
        path: ``obj``'s dotted path in the body (``messages[2]``), ``""`` at top level.
        generic: the same path in generic form (``messages[]``).

    Raises:
        BadRequestError: naming the first offending key.
    """
    classify_keys(obj, acting, no_op=checks_of(NO_OP_FIELDS), refused_fields=REFUSED_FIELDS,
                  unknown=lambda full: f"{full}: Extra inputs are not permitted", path=path, generic=generic)

