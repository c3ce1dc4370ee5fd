"""Rendering a checkpoint's Jinja chat template exactly as transformers does.

Model output depends on the prompt byte for byte, so the environment matches
``transformers``' ``apply_chat_template``: a sandboxed, immutable Jinja
environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension, a ``tojson`` filter that neither escapes HTML nor sorts keys, and
the ``raise_exception`` / ``strftime_now`` globals. The inputs are prepared
the same way too: message keys whose value is ``None`` are dropped (OpenAI
clients send ``"content": null`` beside ``tool_calls``), a message's reasoning
is aliased under ``reasoning_content`` and ``thinking``, and the tokenizer's
named special tokens (``eos_token`` ...) are passed as variables.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kestrel_trio.errors import BadRequestError, ModelLoadError

__all__ = ["ChatTemplate", "missing_template_error"]

# Names under which clients send an assistant message's reasoning; the first
# is the one chat templates read (gpt-oss style templates read "thinking").
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _raise_exception(message: str) -> None:
    raise BadRequestError(str(message), param="messages")


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _build_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENVIRONMENT = _build_environment()


def _plain(value: Any) -> Any:
    """A copy of ``value`` made of plain JSON types, safe to hand to a template.

    Subclasses of str/int/float are reduced to the base type (they could carry
    methods the sandbox does not know about); any other object becomes an
    inert ``"<TypeName>"`` placeholder.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    for base in (str, int, float):
        if isinstance(value, base):
            return base(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    return f"<{type(value).__name__}>"


def _prepare_message(message: Any, index: int) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise BadRequestError(f"messages[{index}] must be an object", param="messages")
    prepared = {key: value for key, value in message.items() if value is not None}
    reasoning = next((prepared[key] for key in _REASONING_FIELDS if key in prepared), None)
    if reasoning is not None:
        prepared = {"thinking": reasoning, **prepared, "reasoning_content": reasoning}
    return _plain(prepared)


def _prepare_tools(tools: Sequence[Any] | None) -> list[Any] | None:
    if tools is None:
        return None
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise BadRequestError("tools must be a list of tool schemas", param="tools")
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise BadRequestError(f"tools[{index}] must be an object", param="tools")
    return _plain(list(tools))


class ChatTemplate:
    """A compiled chat template.

    Args:
        source: the Jinja source (chat_template.jinja or tokenizer_config's field).
        special_tokens: named special tokens passed to the template as
            variables, e.g. ``Tokenizer.special_tokens_map``.

    Raises:
        ModelLoadError: the source is not valid Jinja.
    """

    def __init__(self, source: str, *, special_tokens: Mapping[str, str] | None = None) -> None:
        self.source = source
        self._special_tokens = dict(special_tokens or {})
        try:
            self._compiled = _ENVIRONMENT.from_string(source)
            # Every name the template reads from its context, wherever it reads it (macros included).
            self.variables: frozenset[str] = frozenset(jinja2.meta.find_undeclared_variables(_ENVIRONMENT.parse(source)))
        except jinja2.TemplateSyntaxError as exc:
            raise ModelLoadError(f"chat template has a syntax error at line {exc.lineno}: {exc.message}") from exc

    def check_kwargs(self, names: Sequence[str], param: str) -> None:
        """Refuse template variables this template never reads: they would be ignored without a word.

        Args:
            names: the extra variables a request passes (``chat_template_kwargs``' keys).
            param: the request field that carried them, e.g. ``"chat_template_kwargs"``.

        Raises:
            BadRequestError: naming the first unread variable (``param.name``).
        """
        for name in names:
            if name not in self.variables:
                field = f"{param}.{name}"
                extra = sorted(self.variables - {"messages", "tools", "add_generation_prompt", "raise_exception",
                                                 "strftime_now", *self._special_tokens})
                raise BadRequestError(f"'{field}' is not read by this model's chat template (it reads: "
                                      f"{', '.join(extra) or 'no extra variables'})", param=field)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render a conversation into the prompt text.

        Args:
            messages: OpenAI-style messages (``role``, ``content``,
                ``tool_calls``, ...); not modified.
            add_generation_prompt: open an assistant turn at the end.
            tools: OpenAI-style tool schemas, or ``None``.
            **template_kwargs: extra template variables (e.g. ``enable_thinking``);
                they override the special-token variables.

        Returns:
            The prompt text, special tokens spelled out.

        Raises:
            BadRequestError: the messages are malformed or the template
                rejected them (``param`` is ``"messages"`` or ``"tools"``).
        """
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
            raise BadRequestError("messages must be a non-empty list", param="messages")
        variables = _plain({"documents": None, **self._special_tokens, **template_kwargs})
        variables.update(
            messages=[_prepare_message(m, i) for i, m in enumerate(messages)],
            tools=_prepare_tools(tools),
            add_generation_prompt=bool(add_generation_prompt),
        )
        try:
            return self._compiled.render(**variables)
        except BadRequestError:
            raise
        # A template indexing into a malformed message fails with any of these.
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
            raise BadRequestError(f"the chat template cannot render these messages: {exc}", param="messages") from exc


def missing_template_error() -> BadRequestError:
    """The error for a chat request to a checkpoint without a chat template."""
    return BadRequestError(
        "this model has no chat template (no chat_template.jinja, and no chat_template in "
        "tokenizer_config.json), so it cannot serve chat completions; use the completions endpoint",
        param="messages",
    )
