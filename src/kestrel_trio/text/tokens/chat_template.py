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

Tools on templates that cannot render them (see :mod:`kestrel_trio.text.chat_formats.hermes`):

* A request's ``tools`` are rendered by the template itself when it does so
  for this very request: rendered with and without them, each tool's name
  must occur more often with them. That is checked per request because some
  templates write tools only in some positions (beside a system message, in
  the last user turn); a tool without a name only has to change the text.
  Otherwise the template gets no ``tools`` and the messages get the
  Hermes/Qwen tool system prompt instead; if the template then drops that
  prompt, or refuses the messages it makes, the request is refused with a
  400 naming ``tools``: tools are never dropped in silence.
* Tool calls and tool results are rendered by the template when, once per
  template, a probe conversation (a call, its result) comes out with the
  call's name and the result in it; otherwise they are spelled as text in the
  same convention before the template sees them.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kestrel_trio.errors import BadRequestError, ModelLoadError
from kestrel_trio.text.chat_formats.hermes import (
    has_tool_turns,
    tool_names,
    tool_system_prompt,
    tool_turns_as_text,
    with_tool_system_prompt,
)

__all__ = ["ChatTemplate", "missing_template_error"]

# Names under which clients send an assistant message's reasoning; the first
# is the one chat templates read (gpt-oss style templates read "thinking").
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


# The probe conversation's call name and result (renders_tool_turns): strings no template writes by itself.
_PROBE_NAME = "kestrel_probe_function"
_PROBE_RESULT = "kestrel_probe_result"


def _raise_exception(message: str) -> None:
    raise BadRequestError(str(message), param="messages")


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


# Budgets of one render: a template (GGUF metadata, tokenizer_config.json) must not hold a text worker forever
# (nested loops of 10^5 x 10^5) nor build a string of hundreds of MB.
MAX_LOOP_STEPS = 2_000_000  # iterations of every {% for %} of one render, added up
RENDER_SECONDS = 10.0  # a render's deadline, checked at every loop iteration (its CPU is the template's)
MAX_OUTPUT_CHARS = 16 * 2**20  # a rendered prompt, and any string a template's '*' builds

_budget = threading.local()  # the render in progress in this thread: [steps left, deadline (time.monotonic)]


class TemplateBudgetError(BadRequestError):
    """A chat template went over its render budget (loop iterations, time or output size)."""


def _over_budget(what: str) -> TemplateBudgetError:
    return TemplateBudgetError(f"this model's chat template went over its render budget ({what}) on these "
                               "messages; the request was stopped", param="messages")


def _counted(iterable: Any) -> Any:
    """``iterable`` with every step counted against the render's budget (wrapped around every for loop)."""
    budget = getattr(_budget, "state", None)
    for item in iterable:
        if budget is not None:
            budget[0] -= 1
            if budget[0] < 0:
                raise _over_budget(f"more than {MAX_LOOP_STEPS} loop iterations")
            if budget[0] % 1024 == 0 and time.monotonic() > budget[1]:
                raise _over_budget(f"more than {RENDER_SECONDS:g} s")
        yield item


class _BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with every ``{% for %}``'s iterable passed through ``kestrel_counted``, and ``*`` bounded."""

    intercepted_binops = frozenset({"*", "**"})

    def _parse(self, source: str, name: str | None, filename: str | None) -> jinja2.nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(jinja2.nodes.For):
            loop.iter = jinja2.nodes.Filter(loop.iter, "kestrel_counted", [], [], None, None, lineno=loop.lineno)
        return tree

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*" and isinstance(right, int) and isinstance(left, (str, list, tuple)) or \
                operator == "*" and isinstance(left, int) and isinstance(right, (str, list, tuple)):
            sequence, times = (left, right) if isinstance(right, int) else (right, left)
            if len(sequence) * times > MAX_OUTPUT_CHARS:
                raise _over_budget(f"a repetition of more than {MAX_OUTPUT_CHARS} items")
        if operator == "**" and isinstance(right, int) and right > 1024:
            raise _over_budget("a power over 1024")
        return super().call_binop(context, operator, left, right)


def _build_environment() -> ImmutableSandboxedEnvironment:
    env = _BudgetedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["kestrel_counted"] = _counted
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
            tools: OpenAI-style tool schemas, or ``None``; rendered by the
                template, or where it does not render them, as the Hermes/Qwen
                tool system prompt (module doc).
            **template_kwargs: extra template variables (e.g. ``enable_thinking``);
                they override the special-token variables.

        Returns:
            The prompt text, special tokens spelled out.

        Raises:
            BadRequestError: the messages are malformed or the template
                rejected them (``param`` is ``"messages"`` or ``"tools"``), or
                the tools can be rendered neither way (``param`` ``"tools"``).
        """
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
            raise BadRequestError("messages must be a non-empty list", param="messages")
        variables = _plain({"documents": None, **self._special_tokens, **template_kwargs})
        prepared = [_prepare_message(m, i) for i, m in enumerate(messages)]
        plain_tools = _prepare_tools(tools)
        add_generation_prompt = bool(add_generation_prompt)
        if has_tool_turns(prepared) and not self.renders_tool_turns:
            prepared = tool_turns_as_text(prepared)
        if not plain_tools:
            return self._render(variables, prepared, plain_tools, add_generation_prompt)
        if "tools" in self.variables:
            with_tools = self._render(variables, prepared, plain_tools, add_generation_prompt)
            try:
                without = self._render(variables, prepared, None, add_generation_prompt)
            except BadRequestError:  # a template that needs the tools it was given renders them
                return with_tools
            if with_tools != without and all(with_tools.count(name) > without.count(name)
                                             for name in tool_names(plain_tools)):
                return with_tools
        return self._render_tool_fallback(variables, prepared, plain_tools, add_generation_prompt)

    @functools.cached_property
    def renders_tool_turns(self) -> bool:
        """Whether this template renders an assistant's ``tool_calls`` and ``tool`` results itself.

        Decided once, by rendering a probe conversation (a question, a call
        without content, its result) and looking for the call's name and the
        result in the text; a template that fails on it does not.
        """
        probe = [
            {"role": "user", "content": "?"},
            {"role": "assistant", "tool_calls": [{"id": "call_0", "type": "function", "function": {
                "name": _PROBE_NAME, "arguments": {"x": 1}}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": _PROBE_RESULT},
        ]
        try:
            text = self._render(_plain({"documents": None, **self._special_tokens}), probe, None, False)
        except BadRequestError:
            return False
        return _PROBE_NAME in text and _PROBE_RESULT in text

    def _render_tool_fallback(self, variables: dict, messages: list[dict], tools: list[Any],
                              add_generation_prompt: bool) -> str:
        """``tools`` as the Hermes/Qwen system prompt, for a template that does not render them (module doc)."""
        try:
            text = self._render(variables, with_tool_system_prompt(messages, tools), None, add_generation_prompt)
        except BadRequestError as exc:
            self._render(variables, messages, None, add_generation_prompt)  # the messages' own error first
            raise BadRequestError(f"this model's chat template does not render 'tools', and it cannot render "
                                  f"them as a system message either: {exc.message}", param="tools") from exc
        if tool_system_prompt(tools) not in text:
            raise BadRequestError("this model's chat template does not render 'tools', and it drops the system "
                                  "message that would describe them; send the request without 'tools'",
                                  param="tools")
        return text

    def _render(self, variables: dict, messages: list[dict], tools: list[Any] | None,
                add_generation_prompt: bool) -> str:
        _budget.state = [MAX_LOOP_STEPS, time.monotonic() + RENDER_SECONDS]
        try:
            text = self._compiled.render({**variables, "messages": messages, "tools": tools,
                                          "add_generation_prompt": add_generation_prompt})
            if len(text) > MAX_OUTPUT_CHARS:
                raise _over_budget(f"a prompt of more than {MAX_OUTPUT_CHARS} characters")
            return text
        except BadRequestError:
            raise
        except (RecursionError, MemoryError) as exc:  # a macro calling itself; a string too big to build
            raise _over_budget(type(exc).__name__) from None
        # A template indexing into a malformed message fails with any of these.
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
            raise BadRequestError(f"the chat template cannot render these messages: {exc}", param="messages") from exc
        finally:
            _budget.state = None


def missing_template_error() -> BadRequestError:
    """The error for a chat request to a checkpoint without a chat template."""
    return BadRequestError(
        "this model has no chat template (no chat_template.jinja, and no chat_template in "
        "tokenizer_config.json), so it cannot serve chat completions; use the completions endpoint",
        param="messages",
    )
