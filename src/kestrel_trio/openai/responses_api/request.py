"""OpenAI Responses request bodies -> the server's one chat request (:class:`kestrel_trio.openai.ChatRequest`).

Theory of operation: ``POST /v1/responses`` is translated, once, into the validated chat request the
chat-completions route runs, so that templates, tools, images, grammar and admission stay in one place:

* ``instructions`` becomes the first, ``system`` message; ``input`` as a string is one ``user`` message.
* ``input`` as items: a message item (``role`` user / system / developer / assistant; ``content`` a string
  or ``input_text`` / ``input_image`` / ``output_text`` parts) becomes a chat message (``developer`` is
  ``system``; images become the ``image_url`` parts the image code reads); a ``function_call`` item becomes a
  tool call of the assistant turn it follows (or a new one); a ``function_call_output`` item a ``tool``
  message; a ``reasoning`` item the ``reasoning_content`` of the assistant turn that follows it.
* ``tools`` (flat function tools: ``name``, ``description``, ``parameters``) become chat functions;
  ``tool_choice`` none / auto / required / ``{"type": "function", "name"}`` the chat forms.
* ``text.format`` json_object / json_schema becomes the structured output the chat route compiles.
* ``max_output_tokens``, ``temperature``, ``top_p`` and ``stream`` become the sampling fields.
* ``reasoning.effort`` is kept as :attr:`ResponsesRequest.thinking`: ``none`` / ``minimal`` off, ``low`` to
  ``max`` on (chat's ``reasoning_effort`` levels); the route carries it out as any chat request's choice.

What needs stored state (``previous_response_id``, ``conversation``, ``item_reference`` items) is refused;
every rejection is a :class:`BadRequestError` naming the field; unknown keys are refused
(:mod:`kestrel_trio.openai.responses_api.fields`).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import (
    check_object,
    check_str,
    fail,
    get_array,
    get_bool,
    get_int,
    get_number,
    get_object,
    get_str,
    join_path,
    load_object,
    require,
)
from kestrel_trio.openai.request.bodies import ChatRequest, SamplingFields
from kestrel_trio.openai.request.messages import function_spec, unique_tool_name
from kestrel_trio.openai.request.structured import StructuredOutput
from kestrel_trio.openai.request.thinking import REASONING_EFFORTS
from kestrel_trio.openai.responses_api.fields import check_keys

__all__ = ["ResponsesRequest", "parse_responses_request", "parse_input_tokens_request", "EFFORTS",
           "MAX_METADATA_PAIRS"]

# The openai SDK's ReasoningEffort values and whether each switches reasoning on: chat's, one definition.
EFFORTS = REASONING_EFFORTS
MAX_METADATA_PAIRS = 16  # OpenAI's bounds: 16 pairs, keys up to 64 characters, values up to 512
_MAX_METADATA_KEY = 64
_MAX_METADATA_VALUE = 512
# What shapes the prompt (all that POST /v1/responses/input_tokens takes), then what shapes the answer.
_COUNT_KEYS = frozenset({"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                         "reasoning"})
_BODY_KEYS = _COUNT_KEYS | {"max_output_tokens", "temperature", "top_p", "metadata", "stream", "stream_options"}
_ROLES = ("user", "system", "developer", "assistant")


@attrs.frozen
class ResponsesRequest:
    """A validated ``POST /v1/responses`` body.

    Attributes:
        chat: the same request as a chat completion (messages, tools, tool_choice, structured, sampling).
        thinking: True / False from ``reasoning.effort``, or None (not sent: the server's default).
        echo: the request's fields as a Response object reports them (instructions, tools, tool_choice,
            text, reasoning, metadata, ...).
        origins: per chat message, the request path it came from (``instructions``, ``input``, ``input[3]``),
            so that an error found in the chat request (an image the model cannot read) names the field sent.
    """

    chat: ChatRequest
    thinking: bool | None
    echo: dict
    origins: tuple[str, ...] = ()

    def input_path(self, chat_path: str) -> str:
        """The request path of a chat request path (``messages[1].content[0]`` -> ``input[0].content[0]``)."""
        head, _, rest = chat_path.partition("]")
        if not head.startswith("messages["):
            return "input" if chat_path == "messages" else chat_path
        index = int(head[len("messages["):])
        return self.origins[index] + rest if index < len(self.origins) else "input"


def parse_responses_request(body: bytes) -> ResponsesRequest:
    """Parse and validate a ``POST /v1/responses`` body.

    Raises:
        BadRequestError: malformed JSON, a missing ``model`` / ``input``, a field that needs stored state, or
            an invalid or unknown field (``param`` names it).
    """
    return _parse(body, count_only=False)


def parse_input_tokens_request(body: bytes) -> ResponsesRequest:
    """Parse and validate a ``POST /v1/responses/input_tokens`` body: the prompt's fields only, ``model`` optional.

    Raises:
        BadRequestError: as :func:`parse_responses_request`; a sampling field is unknown here.
    """
    return _parse(body, count_only=True)


def _parse(body: bytes, *, count_only: bool) -> ResponsesRequest:
    obj = load_object(body)
    check_keys(obj, _COUNT_KEYS if count_only else _BODY_KEYS)
    model = get_str(obj, "model") if count_only else check_str(require(obj, "model"), "model")
    instructions = get_str(obj, "instructions")
    messages, origins = _input(require(obj, "input"))
    if instructions is not None:
        messages = [{"role": "system", "content": instructions}, *messages]
        origins = ["instructions", *origins]
    tools, echo_tools = _tools(obj.get("tools"))
    tool_choice = _tool_choice(obj.get("tool_choice"), tools)
    parallel = get_bool(obj, "parallel_tool_calls")
    structured, text = _text(obj.get("text"))
    thinking, reasoning = _reasoning(obj.get("reasoning"))
    stream_options = get_object(obj, "stream_options")
    if stream_options is not None:
        check_keys(stream_options, (), path="stream_options", generic="stream_options")
    max_tokens = get_int(obj, "max_output_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise BadRequestError(f"'max_output_tokens' must be at least 1, got {max_tokens}", param="max_output_tokens")
    sampling = SamplingFields(max_tokens=max_tokens, max_tokens_param="max_output_tokens",
                              temperature=get_number(obj, "temperature"), top_p=get_number(obj, "top_p"),
                              stream=bool(get_bool(obj, "stream")))
    chat = ChatRequest(model=model, messages=tuple(messages), tools=tools, tool_choice=tool_choice,
                       chat_template_kwargs={}, sampling=sampling,
                       parallel_tool_calls=True if parallel is None else parallel, structured=structured)
    echo = {"instructions": instructions, "metadata": _metadata(obj.get("metadata")),
            "parallel_tool_calls": chat.parallel_tool_calls, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "max_output_tokens": max_tokens, "tools": echo_tools,
            "tool_choice": _echo_tool_choice(tool_choice), "text": text, "reasoning": reasoning,
            "user": get_str(obj, "user"), "safety_identifier": get_str(obj, "safety_identifier"),
            "prompt_cache_key": get_str(obj, "prompt_cache_key")}
    return ResponsesRequest(chat=chat, thinking=thinking, echo=echo, origins=tuple(origins))


def _metadata(value: Any) -> dict:
    if value is None:
        return {}
    metadata = check_object(value, "metadata")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise BadRequestError(f"'metadata' may hold at most {MAX_METADATA_PAIRS} pairs, got {len(metadata)}",
                              param="metadata")
    for key, item in metadata.items():
        path = join_path("metadata", key)
        if len(key) > _MAX_METADATA_KEY:
            raise BadRequestError(f"'metadata' keys may be at most {_MAX_METADATA_KEY} characters; {key[:20]!r}... "
                                  f"has {len(key)}", param="metadata")
        if len(check_str(item, path)) > _MAX_METADATA_VALUE:
            raise BadRequestError(f"'{path}' may be at most {_MAX_METADATA_VALUE} characters, got {len(item)}",
                                  param=path)
    return dict(metadata)


def _input(value: Any) -> tuple[list[dict], list[str]]:
    """The chat messages of ``input`` (a string, or an array of items: see module doc), and their origins."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}], ["input"]
    if not isinstance(value, list):
        raise fail("input", "a string or an array of input items", value)
    if not value:
        raise BadRequestError("'input' must contain at least one item", param="input")
    builder = _Conversation()
    for i, item in enumerate(value):
        path = join_path("input", i)
        item = check_object(item, path)
        kind = get_str(item, "type", path)
        if kind is None or kind == "message":
            builder.message(item, path)
        elif kind == "function_call":
            builder.function_call(item, path)
        elif kind == "function_call_output":
            builder.function_call_output(item, path)
        elif kind == "reasoning":
            builder.reasoning(item, path)
        elif kind == "item_reference":
            raise BadRequestError(f"'{path}': item references need stored responses; this server is stateless, "
                                  "send the item itself", param=join_path(path, "type"))
        else:
            raise BadRequestError(f"'{path}.type' {kind!r} is not supported; send message, function_call, "
                                  "function_call_output or reasoning items", param=join_path(path, "type"))
    return builder.finish()


@attrs.define
class _Conversation:
    """Input items folded into chat messages, in order."""

    messages: list = attrs.field(factory=list)
    origins: list = attrs.field(factory=list)  # the item path of each message
    reasoning_text: str | None = None  # a reasoning item's text, waiting for its assistant turn
    reasoning_path: str = ""

    def message(self, item: dict, path: str) -> None:
        check_keys(item, ("type", "role", "content"), path=path, generic="input[]")
        role = check_str(require(item, "role", path), join_path(path, "role"))
        if role not in _ROLES:
            field = join_path(path, "role")
            raise BadRequestError(f"'{field}' must be one of {', '.join(_ROLES)}; got {role!r}", param=field)
        content = _content(require(item, "content", path), join_path(path, "content"), role)
        if role == "assistant":
            turn = self._assistant(path)
            assert isinstance(content, str)  # an assistant item holds output_text parts only
            turn["content"] = content if turn["content"] is None else turn["content"] + content
            return
        self._no_reasoning_pending()
        self._append({"role": "system" if role == "developer" else role, "content": content}, path)

    def function_call(self, item: dict, path: str) -> None:
        check_keys(item, ("type", "call_id", "name", "arguments"), path=path, generic="input[]")
        call_id = check_str(require(item, "call_id", path), join_path(path, "call_id"))
        name = check_str(require(item, "name", path), join_path(path, "name"))
        arguments_path = join_path(path, "arguments")
        arguments = check_str(require(item, "arguments", path), arguments_path)
        try:
            parsed = json.loads(arguments)
        except ValueError as exc:
            raise BadRequestError(f"'{arguments_path}' must be a JSON-encoded object: {exc}",
                                  param=arguments_path) from None
        if not isinstance(parsed, dict):
            raise BadRequestError(f"'{arguments_path}' must be a JSON-encoded object", param=arguments_path)
        assistant = self._assistant(path, continuing=True)
        assistant.setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})

    def function_call_output(self, item: dict, path: str) -> None:
        check_keys(item, ("type", "call_id", "output"), path=path, generic="input[]")
        call_id = check_str(require(item, "call_id", path), join_path(path, "call_id"))
        output_path = join_path(path, "output")
        output = require(item, "output", path)
        if not isinstance(output, str):
            output = _content(output, output_path, "tool")  # text only: _content refuses a tool's image
        self._no_reasoning_pending()
        self._append({"role": "tool", "tool_call_id": call_id, "content": output}, path)

    def reasoning(self, item: dict, path: str) -> None:
        check_keys(item, ("type", "content"), path=path, generic="input[]")
        texts = []
        for j, part in enumerate(get_array(item, "content", path) or ()):
            part_path = join_path(join_path(path, "content"), j)
            part = check_object(part, part_path)
            check_keys(part, ("type", "text"), path=part_path, generic="input[].content[]")
            kind = check_str(require(part, "type", part_path), join_path(part_path, "type"))
            if kind != "reasoning_text":
                field = join_path(part_path, "type")
                raise BadRequestError(f"'{field}' must be 'reasoning_text'; got {kind!r}", param=field)
            texts.append(check_str(require(part, "text", part_path), join_path(part_path, "text")))
        if self.reasoning_text is None:
            self.reasoning_path = path
        else:  # consecutive reasoning items: one turn's reasoning
            texts.insert(0, self.reasoning_text)
        self.reasoning_text = "\n".join(texts)

    def _append(self, message: dict, path: str) -> None:
        self.messages.append(message)
        self.origins.append(path)

    def finish(self) -> tuple[list[dict], list[str]]:
        self._no_reasoning_pending()
        if not any(message["role"] in ("user", "tool") for message in self.messages):
            raise BadRequestError("'input' must hold a user message or a function_call_output", param="input")
        return self.messages, self.origins

    def _assistant(self, path: str, *, continuing: bool = False) -> dict:
        """The assistant turn an assistant item belongs to: the last message if it is one, else a new one.

        A message item after a function call of the same turn starts a new turn (``continuing`` False).
        """
        last = self.messages[-1] if self.messages else None
        reusable = last is not None and last["role"] == "assistant" and (continuing or not last.get("tool_calls"))
        if reusable and self.reasoning_text is None:
            return last
        turn: dict = {"role": "assistant", "content": None}
        if self.reasoning_text is not None:
            turn["reasoning_content"] = self.reasoning_text
            self.reasoning_text = None
        self._append(turn, path)
        return turn

    def _no_reasoning_pending(self) -> None:
        if self.reasoning_text is not None:
            raise BadRequestError(f"'{self.reasoning_path}': a reasoning item must be followed by the assistant's "
                                  "message or function_call it led to", param=self.reasoning_path)


def _content(value: Any, path: str, role: str) -> str | list:
    """A message's content: a string, or parts; all-text parts join into one string."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise fail(path, "a string or an array of content parts", value)
    parts: list[dict] = []
    allowed = ("output_text",) if role == "assistant" else ("input_text", "input_image")
    for j, item in enumerate(value):
        part_path = join_path(path, j)
        part = check_object(item, part_path)
        kind = check_str(require(part, "type", part_path), join_path(part_path, "type"))
        if kind not in allowed:
            field = join_path(part_path, "type")
            raise BadRequestError(f"'{field}' must be {' or '.join(allowed)} in a {role} item; got {kind!r}",
                                  param=field)
        if kind == "input_image":
            parts.append(_image(part, part_path))
            continue
        check_keys(part, ("type", "text"), path=part_path, generic="input[].content[]")
        text = check_str(require(part, "text", part_path), join_path(part_path, "text"))
        parts.append({"type": "text", "text": text})
    if all(part["type"] == "text" for part in parts):  # an answer's parts are one text; a user's, paragraphs
        return ("" if role == "assistant" else "\n").join(part["text"] for part in parts)
    if role == "tool":
        raise BadRequestError(f"'{path}': a function_call_output carries text only here", param=path)
    return parts


def _image(part: dict, path: str) -> dict:
    check_keys(part, ("type", "image_url", "file_id"), path=path, generic="input[].content[]")
    if part.get("file_id") is not None:
        field = join_path(path, "file_id")
        raise BadRequestError(f"'{field}': uploaded files are not supported; send the image as 'image_url' (a "
                              "data: URL or an http(s) URL)", param=field)
    url = check_str(require(part, "image_url", path), join_path(path, "image_url"))
    return {"type": "image_url", "image_url": {"url": url}}


def _tools(value: Any) -> tuple[tuple[dict, ...] | None, list]:
    """The chat tools of ``tools``, and the tools as the Response reports them."""
    if value is None:
        return None, []
    if not isinstance(value, list):
        raise fail("tools", "an array", value)
    out, echo = [], []
    names: set[str] = set()
    for i, item in enumerate(value):
        path = join_path("tools", i)
        tool = check_object(item, path)
        kind = check_str(require(tool, "type", path), join_path(path, "type"))
        if kind != "function":
            raise BadRequestError(f"'{path}.type' {kind!r}: hosted tools are not supported; send function tools "
                                  "(type, name, description, parameters)", param=join_path(path, "type"))
        check_keys(tool, ("type", "name", "description", "parameters"), path=path, generic="tools[]")
        name = unique_tool_name(tool, path, names)
        function = function_spec(tool, path)
        out.append({"type": "function", "function": function})
        strict = tool.get("strict")
        echo.append({"type": "function", "name": name, "description": function.get("description"),
                     "parameters": function.get("parameters"), "strict": True if strict is None else strict})
    return (tuple(out) or None), echo


def _tool_choice(value: Any, tools: tuple[dict, ...] | None) -> str | dict | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise BadRequestError(f"'tool_choice' must be none, auto, required or an object; got {value!r}",
                                  param="tool_choice")
        if value == "required" and not tools:
            raise BadRequestError("'tool_choice' is 'required' but no 'tools' were given", param="tool_choice")
        return value
    choice = check_object(value, "tool_choice")
    kind = check_str(require(choice, "type", "tool_choice"), "tool_choice.type")
    if kind != "function":
        raise BadRequestError(f"'tool_choice.type' {kind!r} is not supported; name a function tool with "
                              "{\"type\": \"function\", \"name\": ...}", param="tool_choice.type")
    check_keys(choice, ("type", "name"), path="tool_choice", generic="tool_choice")
    name = check_str(require(choice, "name", "tool_choice"), "tool_choice.name")
    if name not in {tool["function"]["name"] for tool in tools or ()}:
        raise BadRequestError(f"'tool_choice.name' names {name!r}, which is not one of the 'tools'",
                              param="tool_choice.name")
    return {"type": "function", "function": {"name": name}}


def _echo_tool_choice(choice: str | dict | None) -> str | dict:
    if choice is None:
        return "auto"
    if isinstance(choice, dict):
        return {"type": "function", "name": choice["function"]["name"]}
    return choice


def _text(value: Any) -> tuple[StructuredOutput | None, dict]:
    """The structured output of ``text.format``, and ``text`` as the Response reports it."""
    if value is None:
        return None, {"format": {"type": "text"}}
    text = check_object(value, "text")
    check_keys(text, ("format",), path="text", generic="text")
    echo = {"format": {"type": "text"}}
    if text.get("verbosity") is not None:
        echo["verbosity"] = text["verbosity"]
    spec = get_object(text, "format", "text")
    if spec is None:
        return None, echo
    kind = check_str(require(spec, "type", "text.format"), "text.format.type")
    if kind == "text":
        check_keys(spec, ("type",), path="text.format", generic="text.format")
        return None, echo
    if kind == "json_object":
        check_keys(spec, ("type",), path="text.format", generic="text.format")
        echo["format"] = {"type": "json_object"}
        return StructuredOutput("json_object", "text.format"), echo
    if kind != "json_schema":
        raise BadRequestError(f"'text.format.type' must be text, json_object or json_schema; got {kind!r}",
                              param="text.format.type")
    check_keys(spec, ("type", "name", "schema", "description", "strict"), path="text.format",
               generic="text.format")
    name = check_str(require(spec, "name", "text.format"), "text.format.name")
    schema = check_object(require(spec, "schema", "text.format"), "text.format.schema")
    description = get_str(spec, "description", "text.format")  # documentation for the model; checked, not used
    strict = get_bool(spec, "strict", "text.format")
    echo["format"] = {"type": "json_schema", "name": name, "schema": schema, "description": description,
                      "strict": strict}
    return StructuredOutput("json_schema", "text.format.schema", schema=schema, name=name, strict=strict), echo


def _reasoning(value: Any) -> tuple[bool | None, dict | None]:
    """The reasoning choice of ``reasoning.effort`` (None: not sent, the server's default), and ``reasoning`` echoed."""
    if value is None:
        return None, None
    reasoning = check_object(value, "reasoning")
    check_keys(reasoning, ("effort",), path="reasoning", generic="reasoning")
    effort = get_str(reasoning, "effort", "reasoning")
    if effort is not None and effort not in EFFORTS:
        raise BadRequestError(f"'reasoning.effort' must be one of {', '.join(EFFORTS)}; got {effort!r}",
                              param="reasoning.effort")
    echo = {"effort": effort, "summary": reasoning.get("summary")}
    return (None if effort is None else EFFORTS[effort]), echo
