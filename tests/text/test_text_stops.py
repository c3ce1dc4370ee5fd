"""StopStringMatcher: stop strings are never emitted, however the text is split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kestrel_trio.text import StopStringMatcher


def run(stops: tuple[str, ...], deltas: list[str]) -> tuple[list[str], bool]:
    """Feed deltas until a stop; returns the emitted pieces (flush last) and whether it stopped."""
    matcher = StopStringMatcher(stops)
    emitted = []
    for delta in deltas:
        emit, stopped = matcher.push(delta)
        emitted.append(emit)
        if stopped:
            return emitted, True
    emitted.append(matcher.flush())
    return emitted, matcher.stopped


def reference(text: str, stops: tuple[str, ...]) -> str:
    starts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(starts)] if starts else text


def test_stop_split_across_many_deltas() -> None:
    emitted, stopped = run(("<|END|>",), ["Hello ", "wor", "ld<", "|", "E", "N", "D", "|> ignored"])
    assert stopped
    assert emitted == ["Hello ", "wor", "ld", "", "", "", "", ""]


def test_false_start_is_released_once_it_cannot_match() -> None:
    matcher = StopStringMatcher(("STOP",))
    assert matcher.push("a ST") == ("a ", False)
    assert matcher.push("O") == ("", False)
    assert matcher.push("P!") == ("", True)
    matcher = StopStringMatcher(("STOP",))
    assert matcher.push("a ST") == ("a ", False)
    assert matcher.push("OMP") == ("STOMP", False)
    assert matcher.flush() == ""


def test_held_text_is_flushed_at_the_end() -> None:
    matcher = StopStringMatcher(("STOP",))
    assert matcher.push("the end ST") == ("the end ", False)
    assert matcher.flush() == "ST"
    assert not matcher.stopped


def test_stop_at_the_very_start() -> None:
    assert run(("###",), ["###", "more"]) == ([""], True)
    assert run(("###",), ["#", "#", "#"]) == (["", "", ""], True)


def test_overlapping_stops_cut_at_the_earliest_start() -> None:
    # "bcd" starts before "c": the cut waits until "bcd" completes or fails.
    assert run(("bcd", "c"), ["ab", "c", "d"]) == (["a", "", ""], True)
    assert run(("bcd", "c"), ["ab", "c", "x"]) == (["a", "", "b"], True)
    # Self-overlapping stop: "aab" inside "aaab".
    assert run(("aab",), ["a", "a", "a", "b"]) == (["", "", "a", ""], True)


def test_pending_stop_cut_at_flush_sets_stopped() -> None:
    matcher = StopStringMatcher(("bcd", "c"))
    assert matcher.push("abc") == ("a", False)
    assert matcher.flush() == "b"
    assert matcher.stopped


def test_after_a_stop_nothing_more_is_emitted() -> None:
    matcher = StopStringMatcher(("x",))
    assert matcher.push("axb") == ("a", True)
    assert matcher.push("more") == ("", True)
    assert matcher.flush() == ""


def test_no_stops_passes_everything_through() -> None:
    assert run((), ["a", "b"]) == (["a", "b", ""], False)


def test_empty_stop_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher(("ok", ""))


def test_held_text_is_bounded_by_the_longest_stop() -> None:
    matcher = StopStringMatcher(("abcabcabd", "zz"))
    emitted = ""
    for _ in range(100):
        emit, _stopped = matcher.push("abc")
        emitted += emit
    assert len(matcher._held) < len("abcabcabd")
    assert emitted + matcher.flush() == "abc" * 100


@st.composite
def split_text(draw: st.DrawFn) -> tuple[str, tuple[str, ...], list[str]]:
    alphabet = st.sampled_from("abc")
    stops = tuple(draw(st.lists(st.text(alphabet, min_size=1, max_size=4), min_size=1, max_size=3)))
    text = draw(st.text(alphabet, max_size=40))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    return text, stops, pieces


@settings(max_examples=400, deadline=None)
@given(case=split_text())
def test_emitted_text_is_the_text_cut_before_the_first_stop(case: tuple[str, tuple[str, ...], list[str]]) -> None:
    text, stops, pieces = case
    emitted, stopped = run(stops, pieces)
    expected = reference(text, stops)
    assert "".join(emitted) == expected
    assert stopped == any(s in text for s in stops)



def test_the_matched_stop_string_is_named() -> None:
    matcher = StopStringMatcher(["zzz", "lo w", "w"])
    assert matcher.matched is None
    assert matcher.push("hel") == ("he", False)
    assert matcher.push("lo world") == ("l", True)
    assert matcher.matched == "lo w"  # the earliest occurrence, not "w" inside it


def test_a_stop_string_completed_at_flush_is_named() -> None:
    matcher = StopStringMatcher(["ab", "abc"])
    assert matcher.push("xa") == ("x", False)
    assert matcher.flush() == "a" and matcher.matched is None
    matcher = StopStringMatcher(["bcd", "c"])  # "bc" waits on "bcd"; at the end "c" is the stop
    assert matcher.push("abc") == ("a", False)
    assert matcher.flush() == "b" and matcher.stopped and matcher.matched == "c"
