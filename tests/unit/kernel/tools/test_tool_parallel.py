"""Parallel tool calls: simple path-conflict detection, waves in the AI's order."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.errors import ToolInputInvalid
from fluffy.kernel.tools.routing.parallel import (
    PlannedCall,
    conflicts,
    dependencies,
    overlaps,
    plan_batches,
)


def call(
    index: int, reads: tuple[str, ...] = (), writes: tuple[str, ...] = (), **kw: bool
) -> PlannedCall:
    return PlannedCall(index, frozenset(reads), frozenset(writes), **kw)


def test_independent_calls_run_together() -> None:
    calls = [call(0, reads=("src/a.py",)), call(1, reads=("src/a.py",)), call(2, writes=("b.py",))]
    assert plan_batches(calls) == [[0, 1, 2]]


def test_read_after_write_of_the_same_path_is_serialised() -> None:
    calls = [call(0, writes=("src/a.py",)), call(1, reads=("src/a.py",)), call(2, reads=("c",))]
    assert plan_batches(calls) == [[0, 2], [1]]


def test_write_after_read_keeps_the_order() -> None:
    calls = [call(0, reads=("src/a.py",)), call(1, writes=("src/a.py",))]
    assert plan_batches(calls) == [[0], [1]]


def test_two_writes_to_one_path_are_serialised_in_order() -> None:
    calls = [call(0, writes=("a",)), call(1, writes=("a",)), call(2, writes=("a",))]
    assert plan_batches(calls) == [[0], [1], [2]]


def test_overlap_is_prefix_aware() -> None:
    assert overlaps("src", "src/a.py") and overlaps("src/a.py", "src")
    assert not overlaps("src", "src2/a.py")
    assert not overlaps("src/a.py", "src/a.pyc")
    assert plan_batches([call(0, writes=("src/a.py",)), call(1, reads=("src",))]) == [[0], [1]]


@pytest.mark.parametrize("everything", ["", ".", "./", "/abs/path", "../outside", "a/../.."])
def test_the_whole_project_overlaps_everything(everything: str) -> None:
    calls = [call(0, writes=("docs/x.md",)), call(1, reads=(everything,)), call(2, reads=("z",))]
    assert plan_batches(calls) == [[0, 2], [1]]


def test_test_run_reading_everything_waits_for_writes_but_not_for_reads() -> None:
    calls = [
        call(0, reads=("src/a.py",)),
        call(1, writes=("tests/test_a.py",)),
        call(2, reads=("",)),  # test.run
        call(3, reads=("README.md",)),
    ]
    assert plan_batches(calls) == [[0, 1, 3], [2]]


def test_exclusive_calls_run_alone_in_order() -> None:
    calls = [call(0, reads=("a",)), call(1, exclusive=True), call(2, reads=("b",))]
    assert plan_batches(calls) == [[0], [1], [2]]


def test_waves_follow_the_index_not_the_list_position() -> None:
    calls = [call(5, reads=("a",)), call(2, writes=("a",))]
    assert plan_batches(calls) == [[2], [5]]


def test_duplicate_indexes_are_refused() -> None:
    with pytest.raises(ToolInputInvalid, match="share the index 1"):
        plan_batches([call(1), call(1)])


def test_no_calls_no_waves() -> None:
    assert plan_batches([]) == []


# -- properties: an independent oracle on PurePosixPath parts ------------------------

PATHS = ["", ".", "src", "src/a.py", "src/b.py", "src/sub/c.py", "tests", "tests/t.py", "a", "a/b"]


def _parts(path: str) -> tuple[str, ...] | None:
    """None: the whole project."""
    parts = PurePosixPath(path).parts
    return None if not parts or parts == (".",) else parts


def _oracle_overlap(a: str, b: str) -> bool:
    pa, pb = _parts(a), _parts(b)
    if pa is None or pb is None:
        return True
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def _oracle_conflict(x: PlannedCall, y: PlannedCall) -> bool:
    if x.exclusive or y.exclusive:
        return True
    pairs = [(x.writes, y.writes), (x.reads, y.writes), (x.writes, y.reads)]
    return any(_oracle_overlap(p, q) for xs, ys in pairs for p in xs for q in ys)


_paths = st.frozensets(st.sampled_from(PATHS), max_size=3)
_exclusive = st.sampled_from([False] * 7 + [True])
_calls = st.lists(st.tuples(_paths, _paths, _exclusive), max_size=12).map(
    lambda rows: [PlannedCall(i, r, w, exclusive=ex) for i, (r, w, ex) in enumerate(rows)]
)


@settings(max_examples=400, deadline=None)
@given(calls=_calls)
def test_plan_properties(calls: list[PlannedCall]) -> None:
    waves = plan_batches(calls)
    wave_of = {index: w for w, wave in enumerate(waves) for index in wave}
    deps = dependencies(calls)
    for i, x in enumerate(calls):  # the positions of the earlier calls each one waits for
        assert deps[i] == [j for j in range(i) if _oracle_conflict(calls[j], x)]
    by_index = {c.index: c for c in calls}
    # every call exactly once; no empty waves; indexes ascending within a wave
    assert sorted(i for wave in waves for i in wave) == sorted(by_index)
    assert all(wave and wave == sorted(wave) for wave in waves)
    for x in calls:
        for y in calls:
            if x.index >= y.index:
                continue
            clash = _oracle_conflict(x, y)
            assert conflicts(x, y) == clash
            if clash:  # conflicting calls keep their relative order, never share a wave
                assert wave_of[x.index] < wave_of[y.index]
    for c in calls:
        others = [o for o in calls if o.index != c.index]
        if not any(_oracle_conflict(c, o) for o in others):
            assert wave_of[c.index] == 0
        if wave_of[c.index] > 0:  # as early as possible: it waits for a conflicting call
            assert any(
                wave_of[o.index] == wave_of[c.index] - 1 and _oracle_conflict(o, c)
                for o in others
                if o.index < c.index
            )
