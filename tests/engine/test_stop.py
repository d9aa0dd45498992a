"""Stop strings on streamed text: matches across chunks, holdback of possible prefixes."""

from __future__ import annotations

import pytest

from freetoken.engine.stop import StopStringMatcher


def test_match_across_chunks_cuts_string_and_rest() -> None:
    m = StopStringMatcher(("</answer>",))
    assert m.feed("The result is 4") == ("The result is 4", None)
    assert m.feed("2</an") == ("2", None)  # "</an" is held back
    assert m.feed("swer> trailing") == ("", "</answer>")


def test_held_prefix_is_released_when_ruled_out() -> None:
    m = StopStringMatcher(("</answer>",))
    assert m.feed("a </") == ("a ", None)
    assert m.feed("and") == ("</and", None)
    assert m.flush() == ""


def test_flush_releases_pending_tail() -> None:
    m = StopStringMatcher(("STOP",))
    assert m.feed("go ST") == ("go ", None)
    assert m.flush() == "ST"


def test_earliest_match_wins_then_list_order() -> None:
    m = StopStringMatcher(("world", "lo w"))
    assert m.feed("hello world") == ("hel", "lo w")
    m2 = StopStringMatcher(("ab", "abc"))
    assert m2.feed("xxabc") == ("xx", "ab")


def test_holdback_uses_longest_possible_prefix_and_overlaps() -> None:
    m = StopStringMatcher(("aab",))
    assert m.feed("xaa") == ("x", None)  # "aa" could start "aab"
    assert m.feed("a") == ("a", None)  # "aaa": only the last "aa" can still start it
    assert m.feed("b") == ("", "aab")


def test_no_stops_passes_text_through() -> None:
    m = StopStringMatcher(())
    assert m.feed("anything") == ("anything", None)


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ValueError, match="stop strings must be non-empty"):
        StopStringMatcher(("ok", ""))
