"""Anthropic Messages request bodies -> the server's one chat request (:class:`kestrel_trio.openai.ChatRequest`).

Theory of operation: ``POST /v1/messages`` and ``/v1/messages/count_tokens`` are translated, once, into the
validated chat request the OpenAI route runs, so that templates, tools, images, grammar and admission stay in
one place:

* ``system`` (a string or text blocks) becomes the first, ``system`` message; a ``system`` turn inside
  ``messages`` (Claude Code 2.1.154+ sends them, Anthropic's mid-conversation system beta) a ``system`` message
  at its place. A text block opening with ``x-anthropic-billing-header:`` (Claude Code's attribution line) is
  dropped: it differs on every request, and kept it would make every prompt differ from its first tokens, so
  the prefix cache could never reuse a turn's KV.
* ``context_management`` edits ``clear_thinking_20251015`` are accepted (earlier reasoning is rendered as the
  template renders it); other edits are server-side context editing, refused.
* A user turn's ``tool_result`` blocks become ``tool`` messages (in order), its text and ``image`` blocks a
  ``user`` message (images as the ``image_url`` parts the image code reads: base64 sources as ``data:`` URLs).
* An assistant turn's text blocks become its content, its ``tool_use`` blocks its ``tool_calls`` (``input``
  JSON-encoded as ``arguments``), its ``thinking`` blocks its ``reasoning_content``.
* A last assistant turn holding text only is a prefill: the answer continues it (Anthropic's behaviour).
* ``tools`` and ``tool_choice`` become functions and the chat tool choice (:mod:`kestrel_trio.anthropic.tools`,
  which also holds back ``defer_loading`` tools until a ``tool_reference`` block loads them).
* ``max_tokens`` (required), ``temperature`` (0 to 1, as Anthropic's), ``top_p``, ``top_k``,
  ``stop_sequences`` and ``stream`` become the sampling fields.
* ``thinking`` ``{"type": "enabled", "budget_tokens": n}`` / ``{"type": "disabled"}`` is kept as
  :attr:`MessagesRequest.thinking` and is the chat request's ``thinking`` (``thinking_param``
  ``"thinking"``), carried out as for Chat Completions' ``reasoning_effort``; ``budget_tokens`` is its
  ``thinking_budget``: the reasoning is cut there (:mod:`kestrel_trio.text.constraints.reasoning_budget`).

Every rejection is a :class:`BadRequestError` naming the field; unknown keys are refused
(:mod:`kestrel_trio.anthropic.fields`).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from kestrel_trio.anthropic.fields import check_keys
from kestrel_trio.anthropic.tools import TOOL_REFERENCE, parse_tool_choice, parse_tools, referenced_tools
from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai import ChatRequest, SamplingFields
from kestrel_trio.openai.fields.access import (
    check_object,
    check_str,
    fail,
    get_array,
    get_bool,
    get_int,
    get_number,
    join_path,
    load_object,
    require,
)

__all__ = ["MessagesRequest", "parse_messages_request", "parse_count_tokens_request", "check_query",
           "MAX_STOP_SEQUENCES", "MIN_THINKING_BUDGET"]

MAX_STOP_SEQUENCES = 16  # each is matched against every generated character; Anthropic sets no published bound
MIN_THINKING_BUDGET = 1024  # Anthropic's own minimum for thinking.budget_tokens
_MESSAGES_KEYS = frozenset({"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature",
                            "top_p", "top_k", "tools", "tool_choice", "thinking", "output_config",
                            "context_management"})
_COUNT_KEYS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
                         "context_management"})
# Claude Code's first system block: "x-anthropic-billing-header: cc_version=...; cch=...;", new on every request.
BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
CLEAR_THINKING = "clear_thinking_20251015"
_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


@attrs.frozen
class MessagesRequest:
    """A validated ``POST /v1/messages`` (or ``count_tokens``) body.

    Attributes:
        chat: the same request as a chat completion (messages, tools, tool_choice, sampling).
        thinking: True (``enabled``), False (``disabled``) or None (not sent, or ``adaptive``: the template's
            default, under which Qwen3 reasons).
        thinking_budget: ``thinking.budget_tokens`` when enabled: the chat request's ``thinking_budget``,
            the most tokens the reasoning holds before its end is forced.
        prefill: the text of a final assistant turn, which the answer continues ("" for none).
    """

    chat: ChatRequest
    thinking: bool | None = None
    thinking_budget: int | None = None
    prefill: str = ""


def parse_messages_request(body: bytes) -> MessagesRequest:
    """Parse and validate a ``POST /v1/messages`` body.

    Raises:
        BadRequestError: malformed JSON, a missing ``model``/``messages``/``max_tokens``, or an invalid or
            unknown field (``param`` names it).
    """
    return _parse(body, count_only=False)


def parse_count_tokens_request(body: bytes) -> MessagesRequest:
    """Parse and validate a ``POST /v1/messages/count_tokens`` body (no ``max_tokens`` nor sampling fields)."""
    return _parse(body, count_only=True)


def check_query(query: str) -> None:
    """Accept the query string of a Messages route: ``beta=true`` only, which the SDKs' beta namespace (and so
    Claude Code) appends; it selects nothing here, as the ``anthropic-beta`` header selects nothing.

    Raises:
        BadRequestError: any other parameter, named.
    """
    for pair in filter(None, query.split("&")):
        name, _, value = pair.partition("=")
        if name != "beta":
            raise BadRequestError(f"query parameter {name!r}: Extra inputs are not permitted", param=name)
        if value not in ("true", "false"):
            raise BadRequestError(f"query parameter 'beta' must be true or false; got {value!r}", param="beta")


def _parse(body: bytes, *, count_only: bool) -> MessagesRequest:
    obj = load_object(body)
    check_keys(obj, _COUNT_KEYS if count_only else _MESSAGES_KEYS)
    model = check_str(require(obj, "model"), "model")
    all_tools = parse_tools(obj.get("tools"))
    tool_choice, parallel = parse_tool_choice(obj.get("tool_choice"), all_tools)
    raw_messages = require(obj, "messages")
    messages, prefill = _messages(raw_messages)
    forced = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None
    tools = all_tools.offered(referenced_tools(raw_messages), forced)
    if tools is None and all_tools.functions and tool_choice in ("auto", "none"):
        tool_choice = None  # every tool is deferred and none is loaded yet: the model is shown none
    system = _system(obj.get("system"))
    if system is not None:
        messages = [{"role": "system", "content": system}, *messages]
    output_config = obj.get("output_config")
    if output_config is not None:  # its keys are no-ops or refused (fields.py)
        check_keys(check_object(output_config, "output_config"), (), path="output_config", generic="output_config")
    _context_management(obj.get("context_management"))
    sampling = SamplingFields() if count_only else _sampling(obj)
    thinking, budget = _thinking(obj.get("thinking"), sampling.max_tokens)
    chat = ChatRequest(model=model, messages=tuple(messages), tools=tools, tool_choice=tool_choice,
                       chat_template_kwargs={}, sampling=sampling, parallel_tool_calls=parallel,
                       thinking=thinking, thinking_param="thinking", thinking_budget=budget,
                       thinking_budget_param="thinking.budget_tokens")
    return MessagesRequest(chat=chat, thinking=thinking, thinking_budget=budget, prefill=prefill)


def _sampling(obj: dict) -> SamplingFields:
    max_tokens = get_int(obj, "max_tokens")
    if max_tokens is None:
        raise BadRequestError("max_tokens: Field required", param="max_tokens")
    if max_tokens < 1:
        raise BadRequestError(f"'max_tokens' must be at least 1, got {max_tokens}", param="max_tokens")
    temperature = get_number(obj, "temperature")
    if temperature is not None and not 0.0 <= temperature <= 1.0:
        raise BadRequestError(f"'temperature' must be in [0, 1], got {temperature}", param="temperature")
    return SamplingFields(max_tokens=max_tokens, temperature=temperature, top_p=get_number(obj, "top_p"),
                          top_k=get_int(obj, "top_k"), stop=_stop_sequences(obj), stream=bool(get_bool(obj, "stream")))


def _stop_sequences(obj: dict) -> tuple[str, ...]:
    items = get_array(obj, "stop_sequences") or []
    if len(items) > MAX_STOP_SEQUENCES:
        raise BadRequestError(f"'stop_sequences' may hold at most {MAX_STOP_SEQUENCES} strings, got {len(items)}",
                              param="stop_sequences")
    out = []
    for i, item in enumerate(items):
        path = join_path("stop_sequences", i)
        if not check_str(item, path):
            raise BadRequestError(f"'{path}' must not be empty", param=path)
        out.append(item)
    return tuple(out)


def _thinking(value: Any, max_tokens: int | None) -> tuple[bool | None, int | None]:
    if value is None:
        return None, None
    thinking = check_object(value, "thinking")
    kind = check_str(require(thinking, "type", "thinking"), "thinking.type")
    if kind == "disabled":
        check_keys(thinking, ("type",), path="thinking", generic="thinking")
        return False, None
    if kind == "adaptive":  # the model decides whether to reason: the template's default
        check_keys(thinking, ("type",), path="thinking", generic="thinking")
        return None, None
    if kind != "enabled":
        raise BadRequestError(f"'thinking.type' must be 'enabled', 'adaptive' or 'disabled'; got {kind!r}",
                              param="thinking.type")
    check_keys(thinking, ("type", "budget_tokens"), path="thinking", generic="thinking")
    budget = get_int(thinking, "budget_tokens", "thinking")
    if budget is None:
        raise BadRequestError("thinking.budget_tokens: Field required", param="thinking.budget_tokens")
    if budget < MIN_THINKING_BUDGET:
        raise BadRequestError(f"'thinking.budget_tokens' must be at least {MIN_THINKING_BUDGET}, got {budget}",
                              param="thinking.budget_tokens")
    if max_tokens is not None and budget >= max_tokens:
        raise BadRequestError(f"'max_tokens' must be greater than 'thinking.budget_tokens' ({budget}), got "
                              f"{max_tokens}", param="max_tokens")
    return True, budget


def _context_management(value: Any) -> None:
    """Check ``context_management``: only ``clear_thinking_20251015`` edits, which change nothing here."""
    if value is None:
        return
    check_keys(check_object(value, "context_management"), ("edits",), path="context_management",
               generic="context_management")
    for i, item in enumerate(get_array(value, "edits", "context_management") or []):
        path = join_path("context_management.edits", i)
        edit = check_object(item, path)
        kind = check_str(require(edit, "type", path), join_path(path, "type"))
        if kind != CLEAR_THINKING:
            raise BadRequestError(f"'{path}.type' {kind!r}: server-side context editing is not supported (only "
                                  f"{CLEAR_THINKING} is accepted); trim the conversation before sending it",
                                  param=join_path(path, "type"))
        check_keys(edit, ("type",), path=path, generic="context_management.edits[]")


def _system(value: Any, path: str = "system", generic: str = "system[]") -> str | None:
    """The text of a ``system`` field (or of a system turn's content): a string or text blocks."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise fail(path, "a string or an array of text blocks", value)
    texts = []
    for i, item in enumerate(value):
        block_path = join_path(path, i)
        block = check_object(item, block_path)
        kind = check_str(require(block, "type", block_path), join_path(block_path, "type"))
        if kind != "text":
            raise BadRequestError(f"'{block_path}.type' must be 'text'; got {kind!r}",
                                  param=join_path(block_path, "type"))
        check_keys(block, ("type", "text"), path=block_path, generic=generic)
        text = check_str(require(block, "text", block_path), join_path(block_path, "text"))
        if not text.startswith(BILLING_HEADER_PREFIX):  # billing metadata for Anthropic, new on every request
            texts.append(text)
    return "\n".join(texts)


def _messages(value: Any) -> tuple[list[dict], str]:
    """The chat messages of an Anthropic ``messages`` array, and the prefill text of a last assistant turn."""
    if not isinstance(value, list):
        raise fail("messages", "an array", value)
    if not value:
        raise BadRequestError("'messages' must contain at least one message", param="messages")
    out: list[dict] = []
    for i, item in enumerate(value):
        path = join_path("messages", i)
        message = check_object(item, path)
        role = check_str(require(message, "role", path), join_path(path, "role"))
        if role not in ("user", "assistant", "system"):
            field = join_path(path, "role")
            raise BadRequestError(f"'{field}' must be 'user', 'assistant' or 'system'; got {role!r}", param=field)
        check_keys(message, ("role", "content"), path=path, generic="messages[]")
        content = require(message, "content", path)
        if role == "system":  # a mid-conversation instruction: the template renders it where it stands
            out.append({"role": "system", "content": _system(content, join_path(path, "content"),
                                                             "messages[].content[]")})
        elif role == "user":
            out.extend(_user_turn(content, join_path(path, "content")))
        else:
            out.append(_assistant_turn(content, join_path(path, "content")))
    if all(message["role"] == "system" for message in out):
        raise BadRequestError("'messages' must hold a user turn", param="messages")
    prefill = ""
    last = out[-1]
    if last["role"] == "assistant":
        if last.get("tool_calls") or last.get("reasoning_content") is not None:
            raise BadRequestError(f"'messages[{len(value) - 1}]': a final assistant turn (a prefill) may hold text "
                                  "only", param=f"messages[{len(value) - 1}]")
        prefill = last["content"] or ""
        out.pop()
        if not out:
            raise BadRequestError("'messages' must hold a user turn before the final assistant turn",
                                  param="messages")
    return out, prefill


def _blocks(content: Any, path: str) -> list[tuple[str, dict, str]]:
    """``(type, block, path)`` of each content block; a string is one text block."""
    if isinstance(content, str):
        return [("text", {"type": "text", "text": content}, path)]
    if not isinstance(content, list):
        raise fail(path, "a string or an array of content blocks", content)
    out = []
    for j, item in enumerate(content):
        block_path = join_path(path, j)
        block = check_object(item, block_path)
        out.append((check_str(require(block, "type", block_path), join_path(block_path, "type")), block, block_path))
    return out


def _user_turn(content: Any, path: str) -> list[dict]:
    out: list[dict] = []
    parts: list[dict] = []
    for kind, block, block_path in _blocks(content, path):
        if kind == "tool_result":
            out.extend(_flush_user(parts))
            out.append(_tool_result(block, block_path))
        elif kind == "text":
            parts.append(_text_part(block, block_path))
        elif kind == "image":
            parts.append(_image_part(block, block_path))
        else:
            field = join_path(block_path, "type")
            raise BadRequestError(f"'{field}' must be 'text', 'image' or 'tool_result' in a user turn; got {kind!r}",
                                  param=field)
    out.extend(_flush_user(parts))
    if not out:
        raise BadRequestError(f"'{path}' must not be empty", param=path)
    return out


def _flush_user(parts: list[dict]) -> list[dict]:
    if not parts:
        return []
    taken = list(parts)
    parts.clear()
    if all(part["type"] == "text" for part in taken):
        return [{"role": "user", "content": "\n".join(part["text"] for part in taken)}]
    return [{"role": "user", "content": taken}]


def _text_part(block: dict, path: str) -> dict:
    check_keys(block, ("type", "text"), path=path, generic="messages[].content[]")
    return {"type": "text", "text": check_str(require(block, "text", path), join_path(path, "text"))}


def _image_part(block: dict, path: str) -> dict:
    check_keys(block, ("type", "source"), path=path, generic="messages[].content[]")
    source_path = join_path(path, "source")
    source = check_object(require(block, "source", path), source_path)
    kind = check_str(require(source, "type", source_path), join_path(source_path, "type"))
    if kind == "base64":
        check_keys(source, ("type", "media_type", "data"), path=source_path, generic="source")
        media = check_str(require(source, "media_type", source_path), join_path(source_path, "media_type"))
        if media not in _IMAGE_TYPES:
            field = join_path(source_path, "media_type")
            raise BadRequestError(f"'{field}' must be one of {', '.join(_IMAGE_TYPES)}; got {media!r}", param=field)
        data = check_str(require(source, "data", source_path), join_path(source_path, "data"))
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        check_keys(source, ("type", "url"), path=source_path, generic="source")
        url = check_str(require(source, "url", source_path), join_path(source_path, "url"))
    else:
        field = join_path(source_path, "type")
        raise BadRequestError(f"'{field}' must be 'base64' or 'url'; got {kind!r}", param=field)
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(block: dict, path: str) -> dict:
    check_keys(block, ("type", "tool_use_id", "content", "is_error"), path=path, generic="messages[].content[]")
    call_id = check_str(require(block, "tool_use_id", path), join_path(path, "tool_use_id"))
    content = block.get("content")
    texts = []
    if content is not None:
        for kind, part, part_path in _blocks(content, join_path(path, "content")):
            if kind == TOOL_REFERENCE:  # a deferred tool loaded: it is offered from now on (tools.py)
                check_keys(part, ("type", "tool_name"), path=part_path, generic="messages[].content[]")
                name = check_str(require(part, "tool_name", part_path), join_path(part_path, "tool_name"))
                texts.append(f"Tool loaded: {name}")
                continue
            if kind != "text":
                field = join_path(part_path, "type")
                raise BadRequestError(f"'{field}' must be 'text' or 'tool_reference' (a tool result carries text "
                                      f"only here); got {kind!r}", param=field)
            texts.append(_text_part(part, part_path)["text"])
    text = "\n".join(texts)
    if get_bool(block, "is_error", path):
        text = "Error: " + text  # the template has no field for it: the model reads it in the result
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _assistant_turn(content: Any, path: str) -> dict:
    texts: list[str] = []
    calls: list[dict] = []
    reasoning: list[str] = []
    for kind, block, block_path in _blocks(content, path):
        if kind == "text":
            texts.append(_text_part(block, block_path)["text"])
        elif kind == "tool_use":
            check_keys(block, ("type", "id", "name", "input"), path=block_path, generic="messages[].content[]")
            call_id = check_str(require(block, "id", block_path), join_path(block_path, "id"))
            name = check_str(require(block, "name", block_path), join_path(block_path, "name"))
            arguments = check_object(require(block, "input", block_path), join_path(block_path, "input"))
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
        elif kind == "thinking":
            check_keys(block, ("type", "thinking"), path=block_path, generic="messages[].content[]")
            reasoning.append(check_str(require(block, "thinking", block_path), join_path(block_path, "thinking")))
        else:
            field = join_path(block_path, "type")
            raise BadRequestError(f"'{field}' must be 'text', 'tool_use' or 'thinking' in an assistant turn; got "
                                  f"{kind!r}", param=field)
    out: dict = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "\n".join(reasoning)
    return out
