"""Request bodies -> validated frozen values.

No field is silently ignored: each key either acts, is a documented no-op, or
is refused (see :mod:`kestrel_trio.openai.request.accepted_fields`, and docs/api.md);
``null`` for a known optional field means unset. Every rejection is a
:class:`BadRequestError` whose ``param`` names the offending field (dotted path
for nested fields).
"""

from __future__ import annotations

from typing import Any, NoReturn

import attrs

from kestrel_trio.errors import BadRequestError
from kestrel_trio.openai.fields.access import (
    check_token_id,
    fail,
    get_array,
    get_bool,
    get_object,
    get_str,
    join_path,
    load_object,
)
from kestrel_trio.openai.request.accepted_fields import CHAT, COMPLETIONS, DETOKENIZE, TOKENIZE, check_keys
from kestrel_trio.openai.request.messages import (
    template_messages,
    validate_messages,
    validate_tool_choice,
    validate_tools,
)
from kestrel_trio.openai.request.sampling_fields import (
    SAMPLING_KEYS_CHAT,
    SAMPLING_KEYS_COMPLETIONS,
    SamplingFields,
    parse_sampling_fields,
)
from kestrel_trio.openai.request.structured import StructuredOutput, parse_structured_output
from kestrel_trio.openai.request.thinking import BUDGET_FIELD, parse_thinking, parse_thinking_budget

__all__ = [
    "SamplingFields",
    "ChatRequest",
    "CompletionRequest",
    "TokenizeRequest",
    "DetokenizeRequest",
    "parse_chat_request",
    "parse_completion_request",
    "parse_tokenize_request",
    "parse_detokenize_request",
]


@attrs.frozen
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body.

    Attributes:
        model: the requested model id, or None.
        messages: normalized messages (see :mod:`kestrel_trio.openai.request.messages`).
        tools: validated tool definitions, or None.
        tool_choice: ``"none"``/``"auto"``/``"required"``, a named function, or None.
        chat_template_kwargs: extra template variables (``enable_thinking`` is not among them: see ``thinking``).
        sampling: the sampling fields.
        parallel_tool_calls: False: return at most one tool call per choice (OpenAI's default: True).
        structured: ``response_format`` / ``structured_outputs``, or None for free text.
        thinking: reason before answering (True), do not (False), or the server's default (None)
            (:mod:`kestrel_trio.openai.request.thinking`).
        thinking_param: the request field that set ``thinking``, named by an error.
        thinking_budget: tokens the reasoning may hold before its end is forced
            (:mod:`kestrel_trio.text.constraints.reasoning_budget`), or None for no budget but ``max_tokens``.
        thinking_budget_param: the request field that set ``thinking_budget``, named by an error.
    """

    model: str | None
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None
    tool_choice: str | dict | None
    chat_template_kwargs: dict
    sampling: SamplingFields
    parallel_tool_calls: bool = True
    structured: StructuredOutput | None = None
    thinking: bool | None = None
    thinking_param: str = "reasoning_effort"
    thinking_budget: int | None = None
    thinking_budget_param: str = "thinking.budget_tokens"

    def template_messages(self) -> list[dict]:
        """A fresh copy of ``messages`` for the chat template (tool-call arguments parsed to mappings)."""
        return template_messages(self.messages)


@attrs.frozen
class CompletionRequest:
    """A validated ``POST /v1/completions`` body.

    Attributes:
        model: the requested model id, or None.
        prompt: the prompt text, or the prompt as token ids.
        echo: prepend the prompt to the completion.
        suffix: always None (a non-null suffix is refused).
        sampling: the sampling fields.
        structured: ``response_format`` / ``structured_outputs``, or None for free text.
    """

    model: str | None
    prompt: str | tuple[int, ...]
    echo: bool
    suffix: None
    sampling: SamplingFields
    structured: StructuredOutput | None = None


@attrs.frozen
class TokenizeRequest:
    """A validated ``POST /tokenize`` body (vLLM shape): exactly one of ``prompt`` and ``messages``.

    Attributes:
        model: the requested model id, or None.
        prompt: text to tokenize as is, or None.
        messages: chat messages to render with the chat template, or None.
        add_generation_prompt: with ``messages``, end with the assistant header (default True).
        chat_template_kwargs: extra template variables for ``messages`` (``enable_thinking`` is ``thinking``).
        tools: tool definitions rendered with ``messages``, as chat renders them, or None.
        thinking: ``chat_template_kwargs.enable_thinking``, the reasoning choice, or None (as in chat).
        thinking_param: the field that set ``thinking``.
    """

    model: str | None
    prompt: str | None
    messages: tuple[dict, ...] | None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict = attrs.field(factory=dict)
    tools: tuple[dict, ...] | None = None
    thinking: bool | None = None
    thinking_param: str = "chat_template_kwargs.enable_thinking"

    def template_messages(self) -> list[dict]:
        """A copy of ``messages`` for the chat template (tool-call arguments parsed), as chat renders them."""
        return template_messages(self.messages or ())


@attrs.frozen
class DetokenizeRequest:
    """A validated ``POST /detokenize`` body.

    Attributes:
        model: the requested model id, or None.
        tokens: the token ids to decode.
    """

    model: str | None
    tokens: tuple[int, ...]


def parse_chat_request(body: bytes, *, allow_images: bool = False) -> ChatRequest:
    """Parse and validate a chat completions request body.

    Args:
        body: the raw JSON request body.
        allow_images: accept ``image_url`` content parts in user messages.

    Raises:
        BadRequestError: malformed JSON or an invalid field (``param`` names it).
    """
    obj = load_object(body)
    check_keys(obj, _CHAT_KEYS, endpoint=CHAT)
    model = get_str(obj, "model")
    if obj.get("messages") is None:
        _missing("messages")
    messages = validate_messages(obj["messages"], allow_images=allow_images)
    tools = None if obj.get("tools") is None else validate_tools(obj["tools"])
    tool_choice = None if obj.get("tool_choice") is None else validate_tool_choice(obj["tool_choice"], tools)
    parallel = get_bool(obj, "parallel_tool_calls")
    template_kwargs = dict(_template_kwargs(obj))
    thinking, thinking_param = parse_thinking(obj, template_kwargs)
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        chat_template_kwargs=template_kwargs,
        sampling=parse_sampling_fields(obj, chat=True),
        parallel_tool_calls=True if parallel is None else parallel,
        structured=parse_structured_output(obj),
        thinking=thinking,
        thinking_param=thinking_param,
        thinking_budget=parse_thinking_budget(obj),
        thinking_budget_param=BUDGET_FIELD,
    )


def parse_completion_request(body: bytes) -> CompletionRequest:
    """Parse and validate a (legacy) completions request body.

    Raises:
        BadRequestError: malformed JSON, a missing/empty/batched prompt, a
            non-null ``suffix``, ``best_of`` other than 1, or an invalid field.
    """
    obj = load_object(body)
    check_keys(obj, _COMPLETION_KEYS, endpoint=COMPLETIONS)
    model = get_str(obj, "model")
    prompt = _prompt(obj.get("prompt"))
    echo = bool(get_bool(obj, "echo"))
    return CompletionRequest(
        model=model, prompt=prompt, echo=echo, suffix=None, sampling=parse_sampling_fields(obj, chat=False),
        structured=parse_structured_output(obj),
    )


def parse_tokenize_request(body: bytes) -> TokenizeRequest:
    """Parse and validate a ``/tokenize`` body: ``{"prompt": str}`` or ``{"messages": [...]}``.

    Raises:
        BadRequestError: neither or both of ``prompt``/``messages``, a template
            field beside ``prompt``, or an invalid field.
    """
    obj = load_object(body)
    check_keys(obj, _TOKENIZE_KEYS, endpoint=TOKENIZE)
    model = get_str(obj, "model")
    prompt = get_str(obj, "prompt")
    has_messages = obj.get("messages") is not None
    if (prompt is None) == (not has_messages):
        raise BadRequestError("Exactly one of 'prompt' and 'messages' must be given", param="prompt")
    if prompt is not None:
        for field in _TEMPLATE_ONLY_KEYS:
            if obj.get(field) is not None:
                raise BadRequestError(f"'{field}' applies only with 'messages' (a 'prompt' is tokenized as is)",
                                      param=field)
    add_generation_prompt = get_bool(obj, "add_generation_prompt")
    template_kwargs = dict(_template_kwargs(obj))
    thinking, thinking_param = parse_thinking(obj, template_kwargs)
    return TokenizeRequest(
        model=model,
        prompt=prompt,
        messages=validate_messages(obj["messages"], endpoint=TOKENIZE) if has_messages else None,
        add_generation_prompt=True if add_generation_prompt is None else add_generation_prompt,
        chat_template_kwargs=template_kwargs,
        tools=None if obj.get("tools") is None else validate_tools(obj["tools"]),
        thinking=thinking,
        thinking_param=thinking_param,
    )


def parse_detokenize_request(body: bytes) -> DetokenizeRequest:
    """Parse and validate a ``/detokenize`` body: ``{"tokens": [int, ...]}``.

    Raises:
        BadRequestError: ``tokens`` missing, not an array, or holding a non-token-id.
    """
    obj = load_object(body)
    check_keys(obj, ("model", "tokens"), endpoint=DETOKENIZE)
    model = get_str(obj, "model")
    tokens = get_array(obj, "tokens")
    if tokens is None:
        _missing("tokens")
    return DetokenizeRequest(model=model, tokens=_token_ids(tokens, "tokens"))


# The body keys each parser reads (the acting fields); accepted_fields decides about every other key.
_CHAT_KEYS = SAMPLING_KEYS_CHAT | {"model", "messages", "tools", "tool_choice", "parallel_tool_calls",
                                   "chat_template_kwargs", "response_format", "structured_outputs", "reasoning_effort",
                                   BUDGET_FIELD}
_COMPLETION_KEYS = SAMPLING_KEYS_COMPLETIONS | {"model", "prompt", "echo", "response_format", "structured_outputs"}
_TEMPLATE_ONLY_KEYS = ("add_generation_prompt", "chat_template_kwargs", "tools")
_TOKENIZE_KEYS = frozenset({"model", "prompt", "messages", *_TEMPLATE_ONLY_KEYS})


def _missing(field: str) -> NoReturn:
    raise BadRequestError(f"'{field}' is required", param=field)


def _prompt(value: Any) -> str | tuple[int, ...]:
    if value is None:
        _missing("prompt")
    if isinstance(value, str):
        return _non_empty_text(value, "prompt")
    if not isinstance(value, list):
        raise fail("prompt", "a string, an array of strings or an array of token ids", value)
    if not value:
        raise BadRequestError("'prompt' must not be empty", param="prompt")
    if all(isinstance(item, (str, list)) for item in value):
        if len(value) > 1:
            raise BadRequestError("batched prompts are not supported; send one prompt per request", param="prompt")
        only = value[0]
        if isinstance(only, str):
            return _non_empty_text(only, "prompt[0]")
        if not only:
            raise BadRequestError("'prompt[0]' must not be empty", param="prompt[0]")
        return _token_ids(only, "prompt[0]")
    return _token_ids(value, "prompt")


def _non_empty_text(text: str, path: str) -> str:
    if not text:
        raise BadRequestError(f"'{path}' must not be empty", param=path)
    return text


def _token_ids(items: list, path: str) -> tuple[int, ...]:
    return tuple(check_token_id(item, join_path(path, i)) for i, item in enumerate(items))


# Arguments the server passes to the chat template itself; a request may not set them a second time.
_RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt")


def _template_kwargs(obj: dict) -> dict:
    """``chat_template_kwargs``: extra template variables, none of the reserved names."""
    kwargs = get_object(obj, "chat_template_kwargs") or {}
    for name in _RESERVED_TEMPLATE_KWARGS:
        if name in kwargs:
            field = f"chat_template_kwargs.{name}"
            raise BadRequestError(f"'{field}' cannot be set: the server passes '{name}' to the template itself",
                                  param=field)
    return kwargs
