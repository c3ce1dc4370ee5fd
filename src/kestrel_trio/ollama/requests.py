"""Ollama request bodies -> the server's one chat request (:class:`kestrel_trio.openai.ChatRequest`).

Theory of operation: ``/api/chat`` and ``/api/generate`` are translated, once, into the validated chat
request the OpenAI route runs, so templates, tools, images, grammar and admission stay in one place:

* ``messages``: ``system`` / ``user`` / ``assistant`` / ``tool`` turns. A turn's ``images`` (base64 strings)
  become ``image_url`` parts before its text; an assistant's ``tool_calls`` (``arguments`` an object) become
  OpenAI calls, and its ``thinking`` the ``reasoning_content``; a ``tool`` turn answers the latest call named
  by its ``tool_name`` (or the latest call).
* ``/api/generate``'s ``prompt`` (and ``system``) become one user turn (and a system turn) rendered with the
  model's template; ``raw: true`` sends the prompt as is, through the completions path.
* ``tools``: OpenAI's function shape, which Ollama shares. ``format``: ``"json"`` or a JSON schema, through
  the structured outputs. ``options``: :mod:`kestrel_trio.ollama.options`. ``think``: true / false (or
  "low" / "medium" / "high", which mean true here) is the reasoning choice (``OllamaChat.think``).
* ``stream`` defaults to true, as Ollama's. ``keep_alive`` is accepted: the model stays loaded for the
  server's life whatever it says (a duration is checked to be a number or a string).

Unknown keys are refused with a 400 naming them; so are fields that would change the answer and that this
server does not implement (``suffix``, ``template``, ``context``, ``logprobs``).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from kestrel_trio.errors import BadRequestError
from kestrel_trio.ollama.options import sampling_from_options
from kestrel_trio.openai import ChatRequest, SamplingFields, StructuredOutput
from kestrel_trio.openai.fields.access import (
    check_object, check_str, fail, get_bool, get_str, join_path, load_object, require,
)

__all__ = ["OllamaChat", "OllamaGenerate", "parse_chat", "parse_generate", "parse_embed", "parse_show",
           "model_name", "EmbedInput"]

_CHAT_KEYS = frozenset({"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think"})
_GENERATE_KEYS = frozenset({"model", "prompt", "system", "images", "format", "options", "stream", "keep_alive",
                            "think", "raw"})
_UNSUPPORTED = {  # keys that would change the answer, refused with the reason
    "suffix": "fill-in-the-middle is not supported",
    "template": "the model's own chat template is always used",
    "context": "the deprecated 'context' token list is not supported; send the conversation to /api/chat",
    "logprobs": "log probabilities are served by /v1/chat/completions ('logprobs')",
    "top_logprobs": "log probabilities are served by /v1/chat/completions ('top_logprobs')",
}
_THINK_LEVELS = ("low", "medium", "high")


@attrs.frozen
class OllamaChat:
    """A validated ``/api/chat`` (or ``/api/generate``) request.

    Attributes:
        chat: the same request as a chat completion.
        think: True / False (``think`` sent), or None (the server's ``--reasoning`` default).
        empty: ``messages`` was empty: Ollama's "load the model" call, answered at once.
    """

    chat: ChatRequest
    think: bool | None = None
    empty: bool = False


@attrs.frozen
class OllamaGenerate:
    """A validated ``/api/generate`` request.

    Attributes:
        request: the request as a chat (``raw`` false), for the template to render.
        raw_prompt: the prompt sent as is (``raw`` true), else None.
        empty: no prompt at all: Ollama's "load the model" call, answered at once.
    """

    request: OllamaChat
    raw_prompt: str | None = None
    empty: bool = False


@attrs.frozen
class EmbedInput:
    """A validated ``/api/embed`` or ``/api/embeddings`` request.

    Attributes:
        model: the requested model.
        texts: the texts to embed, in order.
        dimensions: the vector length wanted, or None.
        truncate: ``truncate`` (true, Ollama's default, would cut an input to the context; false refuses it):
            inputs longer than the context are refused either way here, naming the input.
        legacy: ``/api/embeddings`` (one ``prompt``, answered as ``{"embedding": [...]}``).
    """

    model: str
    texts: tuple[str, ...]
    dimensions: int | None = None
    truncate: bool = True
    legacy: bool = False


def model_name(obj: dict) -> str:
    """The ``model`` field (required, non-empty)."""
    name = check_str(require(obj, "model"), "model")
    if not name:
        raise BadRequestError("'model' must not be empty", param="model")
    return name


def parse_chat(body: bytes) -> OllamaChat:
    """Parse and validate an ``/api/chat`` body.

    Raises:
        BadRequestError: malformed JSON, a missing ``model``, or an invalid or unknown field.
    """
    obj = load_object(body)
    _check_keys(obj, _CHAT_KEYS)
    model = model_name(obj)
    _keep_alive(obj)
    raw_messages = require(obj, "messages")
    empty = raw_messages == []
    messages = [{"role": "user", "content": ""}] if empty else _messages(raw_messages)
    tools = _tools(obj.get("tools"))
    sampling = sampling_from_options(obj.get("options"), stream=_stream(obj))
    chat = ChatRequest(model=model, messages=tuple(messages), tools=tools, tool_choice=None, chat_template_kwargs={},
                       sampling=sampling, structured=_format(obj.get("format")))
    return OllamaChat(chat, _think(obj.get("think")), empty=empty)


def parse_generate(body: bytes) -> OllamaGenerate:
    """Parse and validate an ``/api/generate`` body."""
    obj = load_object(body)
    _check_keys(obj, _GENERATE_KEYS)
    model = model_name(obj)
    _keep_alive(obj)
    prompt = get_str(obj, "prompt") or ""
    system = get_str(obj, "system")
    images = _images(obj.get("images"), "images")
    raw = bool(get_bool(obj, "raw"))
    if raw and (system is not None or images or obj.get("think") is not None):
        raise BadRequestError("'raw': a raw prompt is sent as is; 'system', 'images' and 'think' need the template",
                              param="raw")
    sampling = sampling_from_options(obj.get("options"), stream=_stream(obj))
    messages: list[dict] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append(_user(prompt, images))
    chat = ChatRequest(model=model, messages=tuple(messages), tools=None, tool_choice=None, chat_template_kwargs={},
                       sampling=sampling, structured=_format(obj.get("format")))
    return OllamaGenerate(OllamaChat(chat, _think(obj.get("think"))), raw_prompt=prompt if raw else None,
                          empty=not prompt and not images)


def parse_embed(body: bytes, *, legacy: bool = False) -> EmbedInput:
    """Parse and validate an ``/api/embed`` body (``/api/embeddings`` with ``legacy``)."""
    obj = load_object(body)
    keys = {"model", "prompt", "options", "keep_alive"} if legacy else \
        {"model", "input", "truncate", "options", "keep_alive", "dimensions"}
    _check_keys(obj, frozenset(keys))
    model = model_name(obj)
    _keep_alive(obj)
    if obj.get("options"):  # sampling means nothing to an embedding; runtime keys are the documented no-ops
        sampling_from_options(obj.get("options"), stream=False)
    if legacy:
        text = check_str(require(obj, "prompt"), "prompt")
        if not text:
            raise BadRequestError("'prompt' must not be empty", param="prompt")
        return EmbedInput(model, (text,), legacy=True)
    value = require(obj, "input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise fail("input", "a string or a non-empty array of strings", value)
    for i, text in enumerate(texts):
        path = "input" if isinstance(value, str) else join_path("input", i)
        if not check_str(text, path):
            raise BadRequestError(f"'{path}' must not be empty", param=path)
    dimensions = obj.get("dimensions")
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1):
        raise fail("dimensions", "a positive integer", dimensions)
    truncate = get_bool(obj, "truncate")
    return EmbedInput(model, tuple(texts), dimensions, truncate is not False)


def parse_show(body: bytes) -> str:
    """The model an ``/api/show`` body names (``model``, or the older ``name``)."""
    obj = load_object(body)
    _check_keys(obj, frozenset({"model", "name", "verbose", "system", "template", "options"}))
    value = obj.get("model", obj.get("name"))
    if value is None:
        raise BadRequestError("'model': Field required", param="model")
    return check_str(value, "model")


def _check_keys(obj: dict, accepted: frozenset[str]) -> None:
    for key in obj:
        if key in accepted:
            continue
        if key in _UNSUPPORTED and obj[key] not in (None, False, "", []):
            raise BadRequestError(f"'{key}': {_UNSUPPORTED[key]}", param=key)
        if key not in _UNSUPPORTED:
            raise BadRequestError(f"'{key}' is not a field of this request (accepted: {', '.join(sorted(accepted))})",
                                  param=key)


def _stream(obj: dict) -> bool:
    stream = get_bool(obj, "stream")
    return True if stream is None else stream  # Ollama streams unless told not to


def _keep_alive(obj: dict) -> None:
    value = obj.get("keep_alive")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, str))):
        raise fail("keep_alive", "a duration (a number of seconds or a string such as '5m')", value)


def _think(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value in _THINK_LEVELS:
        return True  # a reasoning level: this server's templates switch reasoning on or off only
    raise fail("think", "true, false, 'low', 'medium' or 'high'", value)


def _format(value: Any) -> StructuredOutput | None:
    if value is None or value == "":
        return None
    if value == "json":
        return StructuredOutput("json_object", "format")
    if isinstance(value, dict):
        return StructuredOutput("json_schema", "format", schema=value)
    raise fail("format", "'json' or a JSON schema object", value)


def _images(value: Any, path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise fail(path, "an array of base64-encoded images", value)
    return [check_str(item, join_path(path, i)) for i, item in enumerate(value)]


def _user(text: str, images: list[str]) -> dict:
    if not images:
        return {"role": "user", "content": text}
    # Images before the turn's text, where Ollama puts them. The decoder reads the image's own header; the
    # media type of the data URL only says "an image".
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
                         for data in images]
    return {"role": "user", "content": parts + ([{"type": "text", "text": text}] if text else [])}


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list):
        raise fail("messages", "an array", value)
    out: list[dict] = []
    calls: list[dict] = []  # every assistant call so far, for the tool turns that answer them
    for i, item in enumerate(value):
        path = join_path("messages", i)
        message = check_object(item, path)
        for key in message:
            if key not in ("role", "content", "images", "tool_calls", "thinking", "tool_name", "tool_call_id"):
                field = join_path(path, key)
                raise BadRequestError(f"'{field}' is not a field of a message", param=field)
        role = check_str(require(message, "role", path), join_path(path, "role"))
        content = get_str(message, "content", path) or ""
        images = _images(message.get("images"), join_path(path, "images"))
        if role in ("system", "user"):
            if role == "system" and images:
                raise BadRequestError(f"'{path}.images': a system turn cannot hold images", param=f"{path}.images")
            out.append({"role": role, "content": content} if role == "system" else _user(content, images))
        elif role == "assistant":
            out.append(_assistant(message, content, path, calls))
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": _answered_call(message, path, calls), "content": content})
        else:
            raise BadRequestError(f"'{path}.role' must be system, user, assistant or tool; got {role!r}",
                                  param=f"{path}.role")
        if images and role not in ("user",):
            raise BadRequestError(f"'{path}.images': only a user turn may hold images", param=f"{path}.images")
    if not out:
        raise BadRequestError("'messages' must contain at least one message", param="messages")
    return out


def _assistant(message: dict, content: str, path: str, calls: list[dict]) -> dict:
    out: dict = {"role": "assistant", "content": content}
    thinking = get_str(message, "thinking", path)
    if thinking:
        out["reasoning_content"] = thinking
    raw_calls = message.get("tool_calls")
    if raw_calls is None:
        return out
    if not isinstance(raw_calls, list):
        raise fail(join_path(path, "tool_calls"), "an array", raw_calls)
    made = []
    for j, raw in enumerate(raw_calls):
        call_path = join_path(join_path(path, "tool_calls"), j)
        function = check_object(require(check_object(raw, call_path), "function", call_path),
                                join_path(call_path, "function"))
        name = check_str(require(function, "name", join_path(call_path, "function")), f"{call_path}.function.name")
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):  # some clients send the JSON text
            try:
                arguments = json.loads(arguments)
            except ValueError as exc:
                raise BadRequestError(f"'{call_path}.function.arguments' is not valid JSON: {exc}",
                                      param=f"{call_path}.function.arguments") from None
        arguments = check_object(arguments, f"{call_path}.function.arguments")
        call_id = raw.get("id") if isinstance(raw.get("id"), str) else f"call_{len(calls)}"
        call = {"id": call_id, "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
        calls.append(call)
        made.append(call)
    if made:
        out["tool_calls"] = made
        out["content"] = content or None
    return out


def _answered_call(message: dict, path: str, calls: list[dict]) -> str:
    """The id of the call a tool turn answers: ``tool_call_id``, else the latest call named ``tool_name``."""
    call_id = get_str(message, "tool_call_id", path)
    if call_id:
        return call_id
    name = get_str(message, "tool_name", path)
    for call in reversed(calls):
        if name is None or call["function"]["name"] == name:
            return call["id"]
    return f"call_{name or 'tool'}"  # a tool result with no call before it: the template shows it all the same


def _tools(value: Any) -> tuple[dict, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise fail("tools", "an array", value)
    out = []
    for i, item in enumerate(value):
        path = join_path("tools", i)
        tool = check_object(item, path)
        kind = tool.get("type", "function")
        if kind != "function":
            raise BadRequestError(f"'{path}.type' must be 'function'; got {kind!r}", param=f"{path}.type")
        function = check_object(require(tool, "function", path), join_path(path, "function"))
        name = check_str(require(function, "name", f"{path}.function"), f"{path}.function.name")
        if not name:
            raise BadRequestError(f"'{path}.function.name' must not be empty", param=f"{path}.function.name")
        entry: dict = {"name": name}
        description = get_str(function, "description", f"{path}.function")
        if description is not None:
            entry["description"] = description
        parameters = function.get("parameters")
        entry["parameters"] = ({"type": "object", "properties": {}} if parameters is None
                               else check_object(parameters, f"{path}.function.parameters"))
        out.append({"type": "function", "function": entry})
    return tuple(out) or None
