"""The chat-format registry, its prompt edits, and the output parser's split invariance (sans-IO, no model)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel_trio.text.chat_formats import HERMES, QWEN3, CallArguments, CallStart, format_for, qwen3

# Reasoning, an answer, two calls: every marker of both families in one output.
ANSWER = ('<think>\nplan it\n</think>\n\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": '
          '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


def counter():
    state = itertools.count()
    return lambda: f"call_{next(state)}"


def run(parser, pieces: list[str]) -> tuple[str, str, list[tuple[str, str, str]]]:
    """Feed ``pieces``; returns (reasoning, content, calls as (id, name, arguments))."""
    reasoning, content, calls = [], [], []
    for out in [parser.push(piece) for piece in pieces] + [parser.finish()]:
        reasoning.append(out[0])
        for piece in out[1]:
            if isinstance(piece, str):
                content.append(piece)
            elif isinstance(piece, CallStart):
                calls.append([piece.id, piece.name, ""])
            else:
                assert isinstance(piece, CallArguments)
                calls[-1][2] += piece.text
    return "".join(reasoning), "".join(content), [tuple(call) for call in calls]


def qwen3_parser(**kwargs):
    return QWEN3.output_parser(reasoning=True, starts_in_reasoning=False, parse_tools=True, make_id=counter(),
                               **kwargs)


def test_a_qwen3_answer_splits_into_reasoning_content_and_calls() -> None:
    assert run(qwen3_parser(), [ANSWER]) == (
        "plan it\n", "Checking.",
        [("call_0", "get_weather", '{"city": "Paris"}'), ("call_1", "get_time", "{}")])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(ANSWER)), max_size=6))
def test_any_cut_of_the_output_gives_the_same_parse(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(ANSWER)]
    pieces = [ANSWER[a:b] for a, b in zip(bounds, bounds[1:])]
    assert run(qwen3_parser(), pieces) == run(qwen3_parser(), [ANSWER])


def test_every_one_character_cut_gives_the_same_parse() -> None:
    """Each marker cut at each of its characters (one delta per character)."""
    assert run(qwen3_parser(), list(ANSWER)) == run(qwen3_parser(), [ANSWER])


def test_a_forced_prefix_is_read_first_and_never_sent_as_content() -> None:
    prefix = QWEN3.forced_tool_prefix({"type": "function", "function": {"name": "get_time"}})
    parser = QWEN3.output_parser(reasoning=True, starts_in_reasoning=False, parse_tools=True, make_id=counter(),
                                 forced_prefix=prefix)
    assert run(parser, ["{}", "}\n</tool_call>"]) == ("", "", [("call_0", "get_time", "{}")])


def test_without_reasoning_or_tools_everything_is_content() -> None:
    parser = QWEN3.output_parser(reasoning=False, starts_in_reasoning=False, parse_tools=False)
    assert run(parser, [ANSWER[:9], ANSWER[9:]]) == ("", ANSWER, [])


def test_hermes_reads_calls_and_leaves_think_tags_as_text() -> None:
    parser = HERMES.output_parser(reasoning=True, starts_in_reasoning=False, parse_tools=True, make_id=counter())
    reasoning, content, calls = run(parser, [ANSWER])
    assert reasoning == "" and content.startswith("<think>\nplan it\n</think>\n\nChecking.") and len(calls) == 2


def test_the_registry_picks_qwen3_by_its_think_token() -> None:
    assert format_for({"<think>": 5}.get) is QWEN3
    assert format_for({"<tool_call>": 7}.get) is HERMES
    assert format_for(None) is HERMES
    assert QWEN3.reasons and not HERMES.reasons


def test_qwen3_prompt_edits() -> None:
    header = "<|im_start|>assistant\n"
    assert QWEN3.close_reasoning(header) == header + qwen3.CLOSED_BLOCK == header + "<think>\n\n</think>\n\n"
    assert QWEN3.close_reasoning(header + "<think>\n") == header + "<think>\n\n</think>\n\n"
    assert QWEN3.close_reasoning(header + qwen3.CLOSED_BLOCK) == header + qwen3.CLOSED_BLOCK
    assert QWEN3.ends_in_reasoning(header + "<think>\n") and not QWEN3.ends_in_reasoning(header)
    assert QWEN3.is_closed(QWEN3.skip_reasoning(header)) and QWEN3.skip_reasoning(header + qwen3.CLOSED_BLOCK) == (
        header + qwen3.CLOSED_BLOCK)
    assert QWEN3.reasoning_before_answer(header, {"enable_thinking": True}) == "<think>\n"
    assert QWEN3.reasoning_before_answer(header, {}) == qwen3.CLOSED_BLOCK
    assert QWEN3.reasoning_before_answer(header + "<think>\n", {}) == ""


def test_a_family_without_reasoning_leaves_the_prompt_alone() -> None:
    prompt = "<|im_start|>assistant\n"
    assert HERMES.close_reasoning(prompt) == HERMES.skip_reasoning(prompt) == prompt
    assert HERMES.reasoning_before_answer(prompt, {"enable_thinking": True}) == ""
    assert not HERMES.ends_in_reasoning(prompt + "<think>") and not HERMES.is_closed(prompt + qwen3.CLOSED_BLOCK)
