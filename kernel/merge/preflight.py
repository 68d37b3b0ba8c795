"""A files merge, decided before anything is written (kernel/merge/merger.py runs it).

For each staged change the project's file is read once: unchanged since it was staged,
the staged content is written; already the staged content, nothing; changed by the
person since, the two changes are merged three-way (:mod:`fluffy.merge3`)
when they do not overlap.  If any file's changes overlap, :class:`MergeOverlap` names
them and shows both versions, and nothing is written at all: a merge lands whole or
not at all.  Each step keeps a copy of what it replaces, so a file changed *while* the
merge writes rolls the whole merge back.
"""

from __future__ import annotations

from pathlib import Path

from fluffy.errors import MergeError, MergeOverlap, MergeRefused
from fluffy.kernel.confined_files import ProtectedPaths, read_existing, safe_relpath
from fluffy.kernel.merge.oplog import MergeStep
from fluffy.kernel.merge.staging import (
    MAX_VIEW_BYTES,
    StagedChange,
    Staging,
    render_diff,
    sha256,
)
from fluffy.merge3 import is_binary, merge3


def file_steps(
    project: Path, guard: ProtectedPaths, staging: Staging, changes: list[StagedChange]
) -> tuple[list[MergeStep], dict[str, bytes], list[str]]:
    """Every step with its final content, decided before anything is written."""
    ordered = sorted(changes, key=lambda c: (c.op != "delete", c.path))
    steps: list[MergeStep] = []
    sources: dict[str, bytes] = {}
    overlaps: list[str] = []
    merged3: list[str] = []
    for number, change in enumerate(ordered):
        step_id = f"{number:05d}"
        guard.check(safe_relpath(change.path))
        current = read_existing(project, change.path, MAX_VIEW_BYTES)
        now = None if current is None else sha256(current)
        before = None
        if current is not None:
            before = f"{step_id}.before"
            sources[before] = current
        if change.op == "delete":
            if now not in (None, change.base_sha256):
                overlaps.append(change.path)
            steps.append(MergeStep(step_id, "delete", change.path, now, None, None, before))
            continue
        data = staging.read(change.path)
        if data is None or sha256(data) != change.sha256:
            raise MergeError(
                f"staged content of {change.path!r} does not match its record",
                why="the staging area was changed outside the kernel",
                fix="Discard the staged changes and make them again.",
            )
        if now not in (change.base_sha256, change.sha256):  # the person changed it
            base = staging.base(change.path)
            both = None if base is None or current is None else merge3(base, current, data)
            if both is None or is_binary(both):
                overlaps.append(change.path)
                continue
            data = both
            merged3.append(change.path)
        source = f"{step_id}.content"
        sources[source] = data
        steps.append(MergeStep(step_id, "write", change.path, now, sha256(data), source, before))
    if overlaps:
        raise MergeOverlap(
            f"nothing was merged: {', '.join(overlaps)} changed in the project since the "
            "session staged "
            + ("it" if len(overlaps) == 1 else "them")
            + ", and the changes overlap",
            paths=overlaps,
            why=_both_versions(staging, overlaps, project),
        )
    return steps, sources, merged3


def _both_versions(staging: Staging, paths: list[str], project: Path) -> str:
    """What the person changed and what the session changed, for each overlapping path
    (bounded): both are shown, the person's is kept."""
    parts: list[str] = []
    for path in paths:
        base = staging.base(path)
        try:
            theirs = read_existing(project, path, MAX_VIEW_BYTES)
        except (OSError, MergeRefused):
            theirs = None
        mine = staging.read(path)
        parts.append(
            f"your change to {path} since the session staged it:\n"
            + render_diff(path, base, theirs)[:3000]
        )
        parts.append(f"the session's change to {path}:\n" + render_diff(path, base, mine)[:3000])
    return "\n".join(parts)[:12_000]
