"""Anthropic ``tools`` and ``tool_choice`` -> the chat request's functions, and deferred tools.

Theory of operation: client tools (``name``, ``description``, ``input_schema``) become chat functions, so the
template shows them and the grammar holds every call's arguments to its schema; ``tool_choice`` auto / any /
tool / none becomes ``"auto"`` / ``"required"`` / a named function / ``"none"``, ``disable_parallel_tool_use``
``parallel_tool_calls: false``.

A tool with ``defer_loading: true`` (Claude Code marks most of its tools so when it runs tool search) is held
back, as Anthropic holds it back: the model is not shown it until a ``tool_reference`` block naming it comes
back in a ``tool_result`` (the answer of the client's tool-search tool), from then on it is offered like any
other. A ``tool_choice`` naming a deferred tool offers it too: it could not be forced otherwise.
"""

from __future__ import annotations

from typing import Any

from kestrel_trio.anthropic.fields import check_keys
from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import check_object, check_str, fail, get_bool, join_path, require
from kestrel_trio.openai.request.messages import unique_tool_name

__all__ = ["Tools", "parse_tools", "parse_tool_choice", "referenced_tools", "TOOL_REFERENCE"]

TOOL_REFERENCE = "tool_reference"  # a tool_result content block that loads a deferred tool: {"tool_name": ...}


class Tools:
    """The request's client tools as chat functions (``functions``), and the names of the deferred ones."""

    def __init__(self, functions: tuple[dict, ...], deferred: frozenset[str]) -> None:
        self.functions = functions
        self.deferred = deferred

    def offered(self, referenced: set[str], forced: str | None) -> tuple[dict, ...] | None:
        """The functions shown to the model: every tool not deferred, and the deferred ones ``referenced`` (or
        ``forced`` by tool_choice); None for none."""
        shown = tuple(tool for tool in self.functions if tool["function"]["name"] not in self.deferred
                      or tool["function"]["name"] in referenced or tool["function"]["name"] == forced)
        return shown or None


def parse_tools(value: Any) -> Tools:
    """Check ``tools``: client tools only (a server tool's ``type`` is refused, named)."""
    if value is None:
        return Tools((), frozenset())
    if not isinstance(value, list):
        raise fail("tools", "an array", value)
    out = []
    names: set[str] = set()
    deferred: set[str] = set()
    for i, item in enumerate(value):
        path = join_path("tools", i)
        tool = check_object(item, path)
        kind = tool.get("type")
        if kind is not None and kind != "custom":
            raise BadRequestError(f"'{path}.type' {kind!r}: Anthropic's server tools are not supported; send "
                                  "client tools (name, description, input_schema)", param=join_path(path, "type"))
        check_keys(tool, ("type", "name", "description", "input_schema", "defer_loading"), path=path,
                   generic="tools[]")
        function: dict = {"name": unique_tool_name(tool, path, names)}
        description = tool.get("description")
        if description is not None:
            function["description"] = check_str(description, join_path(path, "description"))
        function["parameters"] = check_object(require(tool, "input_schema", path), join_path(path, "input_schema"))
        if get_bool(tool, "defer_loading", path):
            deferred.add(function["name"])
        out.append({"type": "function", "function": function})
    return Tools(tuple(out), frozenset(deferred))


def parse_tool_choice(value: Any, tools: Tools) -> tuple[str | dict | None, bool]:
    """The chat ``tool_choice`` and ``parallel_tool_calls`` of Anthropic's ``tool_choice``."""
    if value is None:
        return None, True
    choice = check_object(value, "tool_choice")
    kind = check_str(require(choice, "type", "tool_choice"), "tool_choice.type")
    acting = ("type", "disable_parallel_tool_use") + (("name",) if kind == "tool" else ())
    check_keys(choice, acting, path="tool_choice", generic="tool_choice")
    parallel = not get_bool(choice, "disable_parallel_tool_use", "tool_choice")
    if kind in ("auto", "none"):
        return kind, parallel
    if kind not in ("any", "tool"):
        raise BadRequestError(f"'tool_choice.type' must be one of auto, any, tool, none; got {kind!r}",
                              param="tool_choice.type")
    if not tools.functions:
        raise BadRequestError(f"'tool_choice' is {kind!r} but no 'tools' were given", param="tool_choice")
    if kind == "any":
        return "required", parallel
    name = check_str(require(choice, "name", "tool_choice"), "tool_choice.name")
    if name not in {tool["function"]["name"] for tool in tools.functions}:
        raise BadRequestError(f"'tool_choice.name' names {name!r}, which is not one of the 'tools'",
                              param="tool_choice.name")
    return {"type": "function", "function": {"name": name}}, parallel


def referenced_tools(messages: list) -> set[str]:
    """The tool names of every ``tool_reference`` block in the ``tool_result`` blocks of ``messages`` (already
    checked by the message parser)."""
    names: set[str] = set()
    for message in messages:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                names.update(part["tool_name"] for part in block["content"] if part.get("type") == TOOL_REFERENCE)
    return names
