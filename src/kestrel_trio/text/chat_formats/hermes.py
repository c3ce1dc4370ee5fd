"""Hermes' tool-call format (NousResearch; Qwen2.5's and Qwen3's templates use it): its tags, how a call is
read from model output and written into a prompt, and the tools spelled as plain messages for a template
that cannot render them.

A call is ``<tool_call>\n{"name": <function>, "arguments": <object>}\n</tool_call>``, one JSON object
between the tags; a tool result goes back inside ``<tool_response>`` tags. Model output is read by the
family-neutral :class:`~.tool_calls.ToolCallParser` given :data:`TAGS`; :func:`forced_tool_prefix` is the
start of an answer that ``tool_choice`` forces; :func:`call_text` writes one call (a past assistant turn, or
a call cut off before its arguments closed, which Ollama's API sends back as text).

Some chat templates (SmolLM2's, most base Llama ones) never read ``tools``
and have no idea of ``tool_calls`` or a ``tool`` role. For them the
request is rewritten into messages every template renders, in the
convention Qwen2.5 and Qwen3 templates use themselves (NousResearch's
Hermes format), so that the ``<tool_call>`` parser reads the answer:

* the tools go into the system message: :func:`tool_system_prompt` is the
  text Qwen's templates write (function signatures as JSON lines inside
  ``<tools></tools>``, then the instruction to answer with
  ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``), appended to the
  request's first system message or, without one, sent as the system message
  (it then replaces a default system prompt the template would have added);
* an assistant message's ``tool_calls`` become ``<tool_call>`` blocks in its
  content, after its text (:func:`tool_turns_as_text`);
* each run of consecutive ``tool`` messages becomes one ``user`` message of
  ``<tool_response>`` blocks, in order, as Qwen's templates render them.

Everything here is a pure function of plain JSON values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kestrel_trio.text.chat_formats.tool_calls import ToolCallTags

__all__ = ["TAGS", "forced_tool_prefix", "call_text", "tool_system_prompt", "with_tool_system_prompt",
           "tool_turns_as_text", "has_tool_turns", "tool_names"]

TAGS = ToolCallTags("<tool_call>", "</tool_call>")
_RESPONSE_START, _RESPONSE_END = "<tool_response>", "</tool_response>"

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def _json(value: Any) -> str:
    # As the templates' tojson writes it: key order kept, nothing escaped, ", " and ": " separators.
    return json.dumps(value, ensure_ascii=False)


def forced_tool_prefix(tool_choice: str | dict | None) -> str:
    """The start of the answer that ``tool_choice`` forces, appended to the prompt.

    ``"required"`` opens a call (``<tool_call>\\n``); a named function also
    writes its name up to the arguments, so the model continues inside a call
    (to that function); the server's tool grammar then holds the rest to the
    functions' schemas. ``"none"`` and ``"auto"`` force nothing.
    """
    if tool_choice == "required":
        return TAGS.start + "\n"
    if isinstance(tool_choice, dict):
        return TAGS.start + '\n{"name": ' + _json(tool_choice["function"]["name"]) + ', "arguments": '
    return ""


def call_text(name: str, arguments: str, *, closed: bool = True) -> str:
    """One call as the model writes it, its ``arguments`` JSON text as given.

    Args:
        name: the function name.
        arguments: the arguments as JSON text (possibly cut off, with ``closed`` False).
        closed: write the object's closing brace and the closing tag; False leaves the call as it was cut.
    """
    head = TAGS.start + '\n{"name": ' + _json(name) + ', "arguments": ' + arguments
    return head + "}\n" + TAGS.end if closed else head


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The function names of OpenAI-style tools (``tools[i].function.name``); a tool without one is skipped."""
    names = []
    for tool in tools:
        function = tool.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str) and name:
            names.append(name)
    return names


def tool_system_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system-prompt description of ``tools``, word for word as Qwen2.5/Qwen3 templates write it.

    Args:
        tools: OpenAI-style tools (``{"type": "function", "function": {...}}``), each written as one JSON line.
    """
    return _TOOLS_INTRO + "".join("\n" + _json(tool) for tool in tools) + _TOOLS_OUTRO


def with_tool_system_prompt(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> list[dict]:
    """``messages`` with :func:`tool_system_prompt` appended to the leading system message, or as a new one.

    A leading system message with text content keeps its text, then a blank
    line, then the tools (Qwen's layout); otherwise a system message holding
    only the tools goes first. ``messages`` is not modified.
    """
    out = [dict(message) for message in messages]
    block = tool_system_prompt(tools)
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content", ""), str):
        text = out[0].get("content", "")
        out[0]["content"] = f"{text}\n\n{block}" if text else block
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def has_tool_turns(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any message is a ``tool`` result or an assistant message with ``tool_calls``."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def tool_turns_as_text(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """``messages`` with tool calls and tool results spelled as text (see module doc); others are copied as is.

    An assistant message keeps its other keys (reasoning, name) and loses
    ``tool_calls``; its content is its text, then each call as
    ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``, one per line.
    ``arguments`` sent as a JSON string are written as sent, a mapping as JSON.
    """
    out: list[dict] = []
    responses: list[str] = []  # the current run of tool results

    def end_run() -> None:
        if responses:
            out.append({"role": "user", "content": "\n".join(responses)})
            responses.clear()

    for message in messages:
        if message.get("role") == "tool":
            responses.append(f"{_RESPONSE_START}\n{_text(message.get('content'))}\n{_RESPONSE_END}")
            continue
        end_run()
        if message.get("role") == "assistant" and message.get("tool_calls"):
            rewritten = {key: value for key, value in message.items() if key != "tool_calls"}
            rewritten["content"] = "\n".join(
                [text for text in (_text(message.get("content")),) if text]
                + [_call_text(call) for call in message["tool_calls"]])
            out.append(rewritten)
        else:
            out.append(dict(message))
    end_run()
    return out


def _call_text(call: Mapping[str, Any]) -> str:
    function = call.get("function", call)  # OpenAI nests the call under "function"
    arguments = function.get("arguments", {})
    written = arguments if isinstance(arguments, str) else _json(arguments)
    return call_text(function.get("name", ""), written)


def _text(content: Any) -> str:
    """A message's content as text: a string as is, text parts joined with newlines, nothing for None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content
                         if isinstance(part, Mapping) and part.get("type") == "text")
    return str(content)
