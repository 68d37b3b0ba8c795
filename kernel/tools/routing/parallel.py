"""Which of the AI's tool calls from one response may run at the same time.

Design (Parallel Tool Call Handling): calls run in parallel by default; "simple conflict
detection" serialises them when a read path of one overlaps a write path of another, or
two calls write to overlapping paths.  No semantic dependency analysis.

Paths are project-relative.  Overlap is path-prefix aware: ``src`` overlaps
``src/a.py``; ``""`` or ``"."`` is the whole project (``test.run`` reads everything,
``git.commit`` writes everything) and overlaps every path; a path that is absolute or
leaves the project (``..``) is treated as the whole project (it can only be refused
later, and must not run beside anything).  An ``exclusive`` call conflicts with every
other call.

:func:`plan_batches` puts each call in the first wave after every earlier call it
conflicts with (waves in order, calls in a wave by index): conflicting calls keep the
AI's order, and a call that conflicts with nothing runs in the first wave.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence
from itertools import pairwise

import msgspec

from fluffy.errors import ToolInputInvalid

WHOLE_PROJECT = ""


class PlannedCall(msgspec.Struct, frozen=True):
    """One call of the batch: its index in the AI's response and what it touches."""

    index: int
    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    exclusive: bool = False


def normalize(path: str) -> str:
    """``path`` as compared here: posix-normal, ``""`` for the whole project."""
    if path in ("", ".") or path.startswith("/") or "\0" in path:
        return WHOLE_PROJECT
    norm = posixpath.normpath(path.replace("\\", "/"))
    if norm == "." or norm == ".." or norm.startswith(("../", "/")):
        return WHOLE_PROJECT
    return norm


def overlaps(a: str, b: str) -> bool:
    """Whether two normalised paths can name the same file."""
    if WHOLE_PROJECT in (a, b) or a == b:
        return True
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return long.startswith(short + "/")


def _any_overlap(xs: Iterable[str], ys: Iterable[str]) -> bool:
    ys = tuple(ys)
    return any(overlaps(x, y) for x in xs for y in ys)


class _Normal(msgspec.Struct, frozen=True):
    reads: frozenset[str]
    writes: frozenset[str]
    exclusive: bool


def _normal(call: PlannedCall) -> _Normal:
    return _Normal(
        frozenset(normalize(p) for p in call.reads),
        frozenset(normalize(p) for p in call.writes),
        call.exclusive,
    )


def _conflict(a: _Normal, b: _Normal) -> bool:
    if a.exclusive or b.exclusive:
        return True
    return (
        _any_overlap(a.writes, b.writes)
        or _any_overlap(a.reads, b.writes)
        or _any_overlap(a.writes, b.reads)
    )


def conflicts(a: PlannedCall, b: PlannedCall) -> bool:
    """Whether two calls must not run at the same time."""
    return _conflict(_normal(a), _normal(b))


def dependencies(calls: Sequence[PlannedCall]) -> list[list[int]]:
    """For each call, the positions of the earlier calls it conflicts with (each call's
    paths normalised once, not once per pair)."""
    normal = [_normal(c) for c in calls]
    return [[j for j in range(i) if _conflict(normal[j], n)] for i, n in enumerate(normal)]


def plan_batches(calls: Sequence[PlannedCall]) -> list[list[int]]:
    """Waves of call indexes: each wave may run concurrently, waves one after another."""
    ordered = sorted(calls, key=lambda c: c.index)
    for before, after in pairwise(ordered):
        if before.index == after.index:
            raise ToolInputInvalid(
                f"two tool calls share the index {after.index}",
                why="each call of a response needs its own index to be ordered",
                fix="This is a bug in fluffy's tool router; please report it.",
            )
    wave_of: list[int] = []
    for waits in dependencies(ordered):  # the first wave after all it conflicts with
        wave_of.append(max((wave_of[j] + 1 for j in waits), default=0))
    waves: list[list[int]] = [[] for _ in range(max(wave_of, default=-1) + 1)]
    for call, wave in zip(ordered, wave_of, strict=True):
        waves[wave].append(call.index)
    return waves
