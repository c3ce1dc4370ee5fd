"""Qwen3 <think> splitting: examples, a reference model, and split-invariance of streaming."""

from __future__ import annotations

import functools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel_trio.text.chat_formats import qwen3, reasoning

# The family-neutral splitter at Qwen3's tags, as the server runs it for a Qwen3 model.
ReasoningSplitter = functools.partial(reasoning.ReasoningSplitter, qwen3.TAGS)
split_reasoning = functools.partial(reasoning.split_reasoning, qwen3.TAGS)


def stream(pieces: list[str], start_in_reasoning: bool, strip_newlines: bool = True) -> tuple[str, str]:
    splitter = ReasoningSplitter(start_in_reasoning, strip_newlines=strip_newlines)
    reasoning, content = [], []
    for piece in pieces:
        r, c = splitter.push(piece)
        reasoning.append(r)
        content.append(c)
    r, c = splitter.flush()
    return "".join(reasoning) + r, "".join(content) + c


def reference(text: str, start_in_reasoning: bool, strip_newlines: bool = True) -> tuple[str | None, str]:
    """An independent statement of the rules: toggle on tags, drop stray tags, strip framing newlines."""
    in_reasoning = saw = start_in_reasoning
    out = {True: "", False: ""}
    strip = None
    for i, segment in enumerate(re.split(r"(<think>|</think>)", text)):
        if i % 2:  # a tag
            entering = segment == "<think>"
            if entering != in_reasoning:
                in_reasoning, saw = entering, saw or entering
                strip = ("one" if entering else "all") if strip_newlines else None
            continue
        if strip == "one" and segment:
            segment = segment[1:] if segment.startswith("\n") else segment
            strip = None
        elif strip == "all":
            segment = segment.lstrip("\n")
            strip = None if segment else strip
        out[in_reasoning] += segment
    return (out[True] if saw else None), out[False]


@pytest.mark.parametrize(
    ("text", "start", "expected"),
    [
        ("<think>\nLet me think.\n</think>\n\nThe answer is 4.", False, ("Let me think.\n", "The answer is 4.")),
        ("Let me think.\n</think>\n\nFour.", True, ("Let me think.\n", "Four.")),
        ("Just an answer.", False, (None, "Just an answer.")),
        ("", False, (None, "")),
        ("", True, ("", "")),
        ("<think>\nstill thinking when cut off", False, ("still thinking when cut off", "")),
        ("thinking, cut off", True, ("thinking, cut off", "")),
        ("<think>\n\n\nx</think>y", False, ("\n\nx", "y")),  # exactly one newline after <think>
        ("<think></think>\n\n\n\nanswer\n\n", False, ("", "answer\n\n")),  # all newlines after </think>
        ("a</think>b</think>c", True, ("a", "bc")),  # stray closing tag dropped
        ("<think>a<think>b</think>c", False, ("ab", "c")),  # nested opening tag dropped
        ("a</think></think>\n\nb", True, ("a", "b")),  # a stray tag does not end the newline stripping
        ("<think><think>\n\nb</think>", False, ("\nb", "")),
        ("<think>a</think>b<think>\nc</think>d", False, ("ac", "bd")),  # a second block
        ("x <thinking> y </thinker>", False, (None, "x <thinking> y </thinker>")),  # near-miss tags are text
        ("a < b and c <", False, (None, "a < b and c <")),
    ],
)
def test_examples(text, start, expected):
    assert split_reasoning(text, start) == expected
    assert reference(text, start) == expected
    reasoning, content = stream(list(text), start)
    assert (reasoning if expected[0] is not None else None, content) == expected


def test_without_newline_stripping_nothing_but_tags_is_removed():
    text = "<think>\nplan\n</think>\n\nanswer"
    assert split_reasoning(text, False, strip_newlines=False) == ("\nplan\n", "\n\nanswer")


def test_partial_tag_is_held_back_until_resolved():
    splitter = ReasoningSplitter(start_in_reasoning=True)
    assert splitter.push("step one</th") == ("step one", "")
    assert splitter.push("ink>\n\nDone") == ("", "Done")
    splitter = ReasoningSplitter(start_in_reasoning=False)
    assert splitter.push("x <") == ("", "x ")
    assert splitter.push("b") == ("", "<b")
    assert splitter.push("<thi") == ("", "")
    assert splitter.flush() == ("", "<thi")


def test_saw_reasoning():
    splitter = ReasoningSplitter(start_in_reasoning=False)
    splitter.push("plain")
    assert not splitter.saw_reasoning
    splitter.push("<think>")
    assert splitter.saw_reasoning


PIECES = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "think>", "ink>", "\n", "\n\n", "a", "b c", "中", "😀", ">"])
TEXTS = st.lists(PIECES, max_size=30).map("".join)


@st.composite
def text_and_cuts(draw):
    text = draw(TEXTS)
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=300, deadline=None)
@given(text_and_cuts(), st.booleans(), st.booleans())
def test_streaming_equals_whole_text_for_any_cut(case, start, strip_newlines):
    text, pieces = case
    reasoning, content = split_reasoning(text, start, strip_newlines=strip_newlines)
    assert stream(pieces, start, strip_newlines) == (reasoning or "", content)
    assert (reasoning, content) == reference(text, start, strip_newlines)


@pytest.mark.parametrize("start", [False, True])
def test_every_single_cut_position(start):
    text = "<think>\nA<B</think>\n\nC</think>D<think>E"
    whole = split_reasoning(text, start)
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert stream([text[:i], text[i:j], text[j:]], start) == (whole[0] or "", whole[1]), (i, j)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["<think>", "</think>", "\n", "x", "y z", "中"]), max_size=20), st.booleans())
def test_tags_never_reach_the_output(pieces, start):
    # Text without '<' of its own cannot form a tag once tags are removed.
    reasoning, content = stream(pieces, start)
    for tag in ("<think>", "</think>"):
        assert tag not in reasoning and tag not in content
    text_chars = "".join(p for p in pieces if p not in ("<think>", "</think>")).replace("\n", "")
    assert sorted(reasoning.replace("\n", "") + content.replace("\n", "")) == sorted(text_chars)
