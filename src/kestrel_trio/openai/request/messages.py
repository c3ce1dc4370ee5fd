"""Validation of chat ``messages``, ``tools`` and ``tool_choice``.

Messages come out normalized for a chat template: ``developer`` becomes
``system``; text content parts are joined with ``"\\n"`` (as vLLM does) into a
plain string. A key that is neither read here nor a documented no-op
(:data:`kestrel_trio.openai.request.accepted_fields.NO_OP_FIELDS`) is refused with a
400 naming it. Assistant ``tool_calls`` keep their
``arguments`` exactly as sent (a JSON string); :func:`template_messages` makes
the copy a template wants, with ``arguments`` parsed into a mapping.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import (
    check_object,
    check_str,
    fail,
    get_array,
    get_object,
    get_str,
    join_path,
    require,
)
from kestrel_trio.openai.request.accepted_fields import CHAT, check_keys

__all__ = [
    "validate_messages", "validate_tools", "validate_tool_choice", "template_messages", "function_spec",
    "unique_tool_name",
]

_ROLES = ("system", "developer", "user", "assistant", "tool")
_TOOL_CHOICE_MODES = ("none", "auto", "required")
# The keys each role's message may carry (``name``, a documented no-op, is accepted on every role).
_MESSAGE_KEYS = {
    "system": ("role", "content"),
    "developer": ("role", "content"),
    "user": ("role", "content"),
    "assistant": ("role", "content", "tool_calls", "reasoning_content"),
    "tool": ("role", "content", "tool_call_id"),
}


def validate_messages(value: Any, path: str = "messages", *, allow_images: bool = False,
                      endpoint: str = CHAT) -> tuple[dict, ...]:
    """Validate and normalize a ``messages`` array.

    Args:
        value: the decoded ``messages`` field.
        path: its dotted path, for error messages.
        allow_images: accept ``image_url``, ``video_url`` and ``video`` (a list of frame URLs) parts in
            user messages (they are then kept as a list of parts instead of being joined to a string).
        endpoint: the endpoint whose no-op fields apply (see ``accepted_fields``).

    Returns:
        One normalized dict per message.

    Raises:
        BadRequestError: naming the first offending field.
    """
    if not isinstance(value, list):
        raise fail(path, "an array", value)
    if not value:
        raise BadRequestError(f"'{path}' must contain at least one message", param=path)
    generic = f"{path}[]"
    return tuple(_message(item, join_path(path, i), generic, allow_images, endpoint) for i, item in enumerate(value))


def _message(value: Any, path: str, generic: str, allow_images: bool, endpoint: str) -> dict:
    message = check_object(value, path)
    role = check_str(require(message, "role", path), join_path(path, "role"))
    if role not in _ROLES:
        field = join_path(path, "role")
        raise BadRequestError(f"'{field}' must be one of {', '.join(_ROLES)}; got {role!r}", param=field)
    check_keys(message, _MESSAGE_KEYS[role], endpoint=endpoint, path=path, generic=generic)
    out: dict = {"role": "system" if role == "developer" else role}
    name = get_str(message, "name", path)
    if name is not None:
        out["name"] = name
    if role == "assistant":
        _assistant_fields(message, path, generic, out)
    else:
        images_ok = allow_images and role == "user"
        out["content"] = _content(require(message, "content", path), join_path(path, "content"), generic, images_ok)
    if role == "tool":
        out["tool_call_id"] = check_str(require(message, "tool_call_id", path), join_path(path, "tool_call_id"))
    return out


def _assistant_fields(message: dict, path: str, generic: str, out: dict) -> None:
    tool_calls = get_array(message, "tool_calls", path)
    if tool_calls is not None:
        calls_path, calls_generic = join_path(path, "tool_calls"), join_path(generic, "tool_calls[]")
        out["tool_calls"] = [_tool_call(item, join_path(calls_path, i), calls_generic) for i, item in enumerate(tool_calls)]
    content = message.get("content")
    if content is None:
        if not tool_calls:
            field = join_path(path, "content")
            raise BadRequestError(f"'{field}' is required unless the assistant message has tool_calls", param=field)
        out["content"] = None
    else:
        out["content"] = _content(content, join_path(path, "content"), generic, images_ok=False)
    # vLLM extension: earlier reasoning, which Qwen's template can render back.
    reasoning = get_str(message, "reasoning_content", path)
    if reasoning is not None:
        out["reasoning_content"] = reasoning


def _content(value: Any, path: str, message_generic: str, images_ok: bool) -> str | list:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise fail(path, "a string or an array of content parts", value)
    generic = join_path(message_generic, "content[]")
    parts = [_content_part(item, join_path(path, j), generic, images_ok) for j, item in enumerate(value)]
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _content_part(value: Any, path: str, generic: str, images_ok: bool) -> dict:
    part = check_object(value, path)
    kind = check_str(require(part, "type", path), join_path(path, "type"))
    if kind == "text":
        check_keys(part, ("type", "text"), endpoint=CHAT, path=path, generic=generic)
        return {"type": "text", "text": check_str(require(part, "text", path), join_path(path, "text"))}
    if kind in ("image_url", "video_url"):
        check_keys(part, ("type", kind), endpoint=CHAT, path=path, generic=generic)
        inner = check_object(require(part, kind, path), join_path(path, kind))
        url = check_str(require(inner, "url", join_path(path, kind)), join_path(path, f"{kind}.url"))
        check_keys(inner, ("url",), endpoint=CHAT, path=join_path(path, kind), generic=join_path(generic, kind))
        _media_allowed(images_ok, kind, path)
        return {"type": kind, kind: {"url": url}}
    if kind == "video":  # a video sent as its frames: {"type": "video", "video": [image URL, ...]}
        check_keys(part, ("type", "video"), endpoint=CHAT, path=path, generic=generic)
        frames = require(part, "video", path)
        frames_path = join_path(path, "video")
        if not isinstance(frames, list) or not frames:
            raise fail(frames_path, "a non-empty array of image URL strings", frames)
        urls = [check_str(url, join_path(frames_path, k)) for k, url in enumerate(frames)]
        _media_allowed(images_ok, kind, path)
        return {"type": "video", "video": urls}
    field = join_path(path, "type")
    raise BadRequestError(f"'{field}' must be 'text', 'image_url', 'video_url' or 'video'; got {kind!r}", param=field)


def _media_allowed(images_ok: bool, kind: str, path: str) -> None:
    if not images_ok:
        what = "images are" if kind == "image_url" else "videos are"
        raise BadRequestError(f"'{path}': {what} not supported by this model", param=path)


def _tool_call(value: Any, path: str, generic: str) -> dict:
    call = check_object(value, path)
    check_keys(call, ("id", "type", "function"), endpoint=CHAT, path=path, generic=generic)
    call_id = check_str(require(call, "id", path), join_path(path, "id"))
    _expect_function_type(call, path)
    function_path = join_path(path, "function")
    function = check_object(require(call, "function", path), function_path)
    check_keys(function, ("name", "arguments"), endpoint=CHAT, path=function_path, generic=join_path(generic, "function"))
    name = check_str(require(function, "name", function_path), join_path(function_path, "name"))
    arguments_path = join_path(function_path, "arguments")
    arguments = check_str(require(function, "arguments", function_path), arguments_path)
    _parse_arguments(arguments, arguments_path)  # validated now so templating cannot fail later
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _parse_arguments(arguments: str, path: str) -> dict:
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise BadRequestError(f"'{path}' must be a JSON-encoded object: {exc}", param=path) from None
    if not isinstance(parsed, dict):
        raise BadRequestError(f"'{path}' must be a JSON-encoded object, got a JSON {type(parsed).__name__}", param=path)
    return parsed


def _expect_function_type(obj: dict, path: str) -> None:
    kind = check_str(require(obj, "type", path), join_path(path, "type"))
    if kind != "function":
        field = join_path(path, "type")
        raise BadRequestError(f"'{field}' must be 'function'; got {kind!r}", param=field)


def validate_tools(value: Any, path: str = "tools") -> tuple[dict, ...]:
    """Validate a ``tools`` array: ``[{"type": "function", "function": {"name", "description"?, "parameters"?}}]``.

    Returns:
        One normalized dict per tool (``strict``, a documented no-op, kept for the template).

    Raises:
        BadRequestError: naming the first offending field, unknown keys included.
    """
    if not isinstance(value, list):
        raise fail(path, "an array", value)
    if not value:
        raise BadRequestError(f"'{path}' must contain at least one tool", param=path)
    return tuple(_tool(item, join_path(path, i), f"{path}[]") for i, item in enumerate(value))


def _tool(value: Any, path: str, generic: str) -> dict:
    tool = check_object(value, path)
    check_keys(tool, ("type", "function"), endpoint=CHAT, path=path, generic=generic)
    _expect_function_type(tool, path)
    function_path = join_path(path, "function")
    function = check_object(require(tool, "function", path), function_path)
    check_keys(function, ("name", "description", "parameters"), endpoint=CHAT, path=function_path,
               generic=join_path(generic, "function"))
    out = function_spec(function, function_path)
    strict = function.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise fail(join_path(function_path, "strict"), "a boolean", strict)
        out["strict"] = strict
    return {"type": "function", "function": out}


def function_spec(obj: dict, path: str) -> dict:
    """A chat tool's ``function`` object from ``obj``'s ``name``, and ``description`` and ``parameters`` if sent.

    Args:
        obj: the object holding the three keys (a chat tool's ``function``, a Responses function tool).
        path: ``obj``'s dotted path in the body.
    """
    out: dict = {"name": check_str(require(obj, "name", path), join_path(path, "name"))}
    description = get_str(obj, "description", path)
    if description is not None:
        out["description"] = description
    parameters = get_object(obj, "parameters", path)
    if parameters is not None:
        out["parameters"] = parameters
    return out


def unique_tool_name(tool: dict, path: str, seen: set[str]) -> str:
    """``tool``'s required string ``name``, added to ``seen``; a 400 if ``seen`` already holds it."""
    name = check_str(require(tool, "name", path), join_path(path, "name"))
    if name in seen:
        raise BadRequestError(f"'{path}.name': tool names must be unique; {name!r} is repeated",
                              param=join_path(path, "name"))
    seen.add(name)
    return name


def validate_tool_choice(value: Any, tools: tuple[dict, ...] | None, path: str = "tool_choice") -> str | dict:
    """Validate ``tool_choice``: ``"none"``, ``"auto"``, ``"required"`` or a named function.

    ``"required"`` and a named function need ``tools``; a named function must
    be one of them. ``"none"``/``"auto"`` without tools are harmless and accepted.
    """
    if isinstance(value, str):
        if value not in _TOOL_CHOICE_MODES:
            raise BadRequestError(f"'{path}' must be one of none, auto, required, or an object; got {value!r}", param=path)
        if value == "required" and not tools:
            raise BadRequestError(f"'{path}' is 'required' but no 'tools' were given", param=path)
        return value
    if not isinstance(value, dict):
        raise fail(path, "a string or an object", value)
    choice = value
    check_keys(choice, ("type", "function"), endpoint=CHAT, path=path, generic=path)
    _expect_function_type(choice, path)
    function_path = join_path(path, "function")
    function = check_object(require(choice, "function", path), function_path)
    check_keys(function, ("name",), endpoint=CHAT, path=function_path, generic=function_path)
    name_path = join_path(function_path, "name")
    name = check_str(require(function, "name", function_path), name_path)
    if name not in {tool["function"]["name"] for tool in tools or ()}:
        raise BadRequestError(f"'{name_path}' names {name!r}, which is not one of the 'tools'", param=name_path)
    return {"type": "function", "function": {"name": name}}


def template_messages(messages: tuple[dict, ...]) -> list[dict]:
    """A deep copy of validated messages for a chat template: tool-call ``arguments`` parsed to mappings."""
    out = copy.deepcopy(list(messages))
    for message in out:
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out
