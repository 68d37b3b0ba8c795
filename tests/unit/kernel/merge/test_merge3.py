"""Three-way merges of a person's and a session's changes to one file (issue 32)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fluffy.merge3 import merge3

BASE = b"one\ntwo\nthree\nfour\nfive\n"


def test_changes_to_different_places_both_land() -> None:
    ours = b"zero\none\ntwo\nthree\nfour\nfive\n"  # the person added a line on top
    theirs = b"one\ntwo\nthree\nfour\nFIVE\nsix\n"  # the session changed the end
    assert merge3(BASE, ours, theirs) == b"zero\none\ntwo\nthree\nfour\nFIVE\nsix\n"


def test_the_same_change_on_both_sides_is_taken_once() -> None:
    same = b"one\nTWO\nthree\nfour\nfive\n"
    assert merge3(BASE, same, same) == same


def test_changes_to_the_same_or_adjacent_lines_conflict() -> None:
    assert merge3(BASE, b"one\nTWO\nthree\nfour\nfive\n", b"one\n2\nthree\nfour\nfive\n") is None
    assert merge3(BASE, b"one\nTWO\nthree\nfour\nfive\n", b"one\ntwo\nTHREE\nfour\nfive\n") is None
    assert merge3(BASE, b"one\nfour\nfive\n", b"one\ntwo\nTHREE\nfour\nfive\n") is None


lines = st.lists(st.sampled_from([b"a\n", b"b\n", b"c\n", b"d\n"]), max_size=8).map(b"".join)


@given(lines, lines)
def test_a_side_that_changed_nothing_gives_way(base: bytes, other: bytes) -> None:
    assert merge3(base, base, other) == other
    assert merge3(base, other, base) == other


@given(lines, lines, lines)
def test_a_clean_merge_keeps_what_both_sides_kept(base: bytes, ours: bytes, theirs: bytes) -> None:
    merged = merge3(base, ours, theirs)
    if merged is not None and ours == theirs:
        assert merged == ours
