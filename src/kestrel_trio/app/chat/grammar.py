"""Structured outputs in the routes: which grammar a request gets, compiled for the model before any compute.

The routes call :func:`chat_constraint` / :func:`completion_constraint` in a
worker thread (compiling a schema, and the first time the model's grammar
vocabulary, is CPU work), after the prompt is rendered and before the
generation is queued, so a schema that cannot be enforced is a 400 that
names it and nothing runs.

What a chat request is held to:

* ``tool_choice: "required"``: one or more calls of the offered functions,
  each ``{"name": <one of them>, "arguments": <valid under its parameters>}``
  (the prompt already opens the first ``<tool_call>``).
* a named function: its arguments, valid under its parameters (the prompt
  already holds the call up to ``"arguments": ``).
* ``tool_choice: "auto"`` (the default with tools): free text until the model
  writes ``<tool_call>``; from there the call is held to the functions'
  schemas; after ``</tool_call>`` text is free again. With a
  ``response_format`` as well, the answer is either that JSON or tool calls.
* ``response_format`` / ``structured_outputs`` alone: the whole answer.

Reasoning (Qwen3): a constrained answer starts after ``</think>`` and the
reasoning before it is free. How the prompt opens or closes the block before
such an answer is the model's chat format's
(:meth:`kestrel_trio.text.chat_formats.ChatFormat.reasoning_before_answer`);
the tool-call tags are Hermes' (:mod:`kestrel_trio.text.chat_formats.hermes`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kestrel_trio import openai as oa
from kestrel_trio.errors import BadRequestError
from kestrel_trio.model import Model
from kestrel_trio.text.chat_formats import hermes
from kestrel_trio.text.constraints import grammar as g
from kestrel_trio.text.constraints.constraint import Constraint, GrammarVocab, compile_constraint, grammar_vocab
from kestrel_trio.text.constraints.schema_budget import check_schema_budget

__all__ = ["chat_constraint", "completion_constraint"]


def chat_constraint(model: Model, structured: oa.StructuredOutput | None, tools: Sequence[dict] | None,
                    tool_choice: str | dict | None, *, in_reasoning: bool) -> Constraint | None:
    """The compiled constraint of a chat request, or None for free output.

    Args:
        model: the model (its tokenizer and vocabulary size).
        structured: ``response_format`` / ``structured_outputs``.
        tools: the offered tools, or None when none may be called (``tool_choice: "none"``).
        tool_choice: ``"auto"``, ``"required"`` or a named function (with ``tools``).
        in_reasoning: the prompt ends inside an open ``<think>`` block.

    Raises:
        BadRequestError: a schema, regex or grammar that cannot be enforced (``param`` names it).
    """
    _check_budgets(structured, tools or ())
    if tools:
        if tool_choice == "required":
            return _tool_constraint(model, tools, "required")
        if isinstance(tool_choice, dict):
            name = tool_choice["function"]["name"]
            return _tool_constraint(model, [t for t in tools if t["function"]["name"] == name], "named",
                                    indexes=[i for i, t in enumerate(tools) if t["function"]["name"] == name])
        if structured is not None:
            return _answer_or_calls(model, structured, tools, in_reasoning)
        return _tool_constraint(model, tools, "auto", in_reasoning=in_reasoning)
    if structured is None:
        return None
    return completion_constraint(model, structured, in_reasoning=in_reasoning)


def completion_constraint(model: Model, structured: oa.StructuredOutput | None, *,
                          in_reasoning: bool = False) -> Constraint | None:
    """The compiled constraint of ``response_format`` / ``structured_outputs`` alone, or None."""
    if structured is None:
        return None
    _check_budgets(structured, ())
    vocab = _vocab(model)
    kind, param = structured.kind, structured.param
    try:
        if kind == "json_schema":
            grammar = g.json_schema_grammar(structured.schema)
        elif kind == "json_object":
            grammar = g.json_object_grammar()
        elif kind == "regex":
            grammar = g.regex_grammar(structured.text)
        elif kind == "choice":
            grammar = g.choice_grammar(structured.choices)
        else:
            grammar = g.lark_grammar(structured.text)
    except ValueError as exc:  # a GBNF grammar that cannot be converted, or a schema llguidance cannot read
        raise BadRequestError(f"'{param}' cannot be used for structured outputs: {g.clean_message(str(exc))}",
                              param=param) from None
    return compile_constraint(vocab, grammar, kind=kind, param=param, schema=structured.schema,
                              in_reasoning=in_reasoning)


def _check_budgets(structured: oa.StructuredOutput | None, tools: Sequence[dict]) -> None:
    """Every schema of the request within the compile budgets
    (:mod:`kestrel_trio.text.constraints.schema_budget`), together.

    Checked before any schema reaches llguidance, whose JSON compiler unrolls item counts before its own limits
    apply; a request's tools are compiled into one grammar, so their counts add up.
    """
    spent = 0
    if structured is not None and structured.kind == "json_schema":
        spent = check_schema_budget(structured.schema, structured.param)
    for index, tool in enumerate(tools):
        parameters = tool["function"].get("parameters")
        if parameters is not None:
            spent = check_schema_budget(parameters, f"tools[{index}].function.parameters", spent=spent)


def _vocab(model: Model) -> GrammarVocab:
    if model.tokenizer is None:
        raise BadRequestError(f"model {model.name!r} has no tokenizer, which structured outputs need",
                              param="response_format")
    return grammar_vocab(model.tokenizer, model.config.vocab_size)


def _functions(vocab: GrammarVocab, tools: Sequence[dict], indexes: Sequence[int]) -> list[tuple[str, dict]]:
    """``(name, parameters)`` of each tool, each parameter schema checked on its own so an error names its tool."""
    functions = []
    for tool, index in zip(tools, indexes):
        function = tool["function"]
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        param = f"tools[{index}].function.parameters"
        compile_constraint(vocab, g.json_schema_grammar(parameters), kind="tool_call", param=param, schema=parameters)
        functions.append((function["name"], parameters))
    return functions


def _tool_constraint(model: Model, tools: Sequence[dict], mode: str, *, indexes: Sequence[int] | None = None,
                     in_reasoning: bool = False) -> Constraint:
    vocab = _vocab(model)
    functions = _functions(vocab, tools, range(len(tools)) if indexes is None else indexes)
    grammar = g.tool_calls_grammar(functions, mode, special_tags=_special_tags(vocab))
    trigger = hermes.TAGS.start.encode() if mode == "auto" else None
    return compile_constraint(vocab, grammar, kind="tool_call", param="tools", trigger=trigger,
                              in_reasoning=in_reasoning)


def _answer_or_calls(model: Model, structured: oa.StructuredOutput, tools: Sequence[dict],
                     in_reasoning: bool) -> Constraint:
    """``tool_choice: "auto"`` with a JSON response_format: that JSON, or tool calls."""
    if structured.kind not in ("json_schema", "json_object"):
        raise BadRequestError(f"'{structured.param}' cannot be combined with 'tools' under tool_choice 'auto' "
                              "(only a JSON response_format can); set tool_choice to 'none' or 'required'",
                              param=structured.param)
    answer = structured.schema if structured.kind == "json_schema" else {"type": "object"}
    completion_constraint(model, structured)  # the answer's own errors name its field
    vocab = _vocab(model)
    functions = _functions(vocab, tools, range(len(tools)))
    grammar = g.tool_calls_grammar(functions, "answer", special_tags=_special_tags(vocab), answer=answer)
    return compile_constraint(vocab, grammar, kind=structured.kind, param="tools", in_reasoning=in_reasoning)


def _special_tags(vocab: GrammarVocab) -> bool:
    return vocab.special_token(hermes.TAGS.start) is not None and vocab.special_token(hermes.TAGS.end) is not None
