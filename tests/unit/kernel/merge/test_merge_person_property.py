"""Whatever the person does while a session works, nothing they wrote is lost or taken.

Hypothesis interleaves a person's edits (uncommitted before the session starts, and made
while it works, to the files the session changes and to others, new untracked files)
with a session's staged changes and its merge, and checks: a merge either lands whole,
three-way where both changed a file, or writes nothing and names the overlapping files;
the person's own lines are always in the project afterwards; what the commit takes (the
landed record carried onto HEAD, as git.commit does) is only the session's files, with
the session's lines and none of the person's -- or, where the session rewrote a line the
person had not committed, that file left out (issue 32)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluffy.errors import MergeOverlap
from fluffy.kernel.merge.landed import Change, Landed
from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.merge.staging import Staging
from fluffy.merge3 import carry

FILES = ("src/a.py", "src/b.py", "src/c.py")
BASE = [f"line {i}\n" for i in range(8)]

edit = st.tuples(st.sampled_from(FILES), st.integers(0, 7))


def commit_of(landed: Landed, rel: str, head: bytes) -> bytes | None:
    """What git.commit takes of ``rel`` (None: left out), as plugins/git_tool/landing.py."""
    content: bytes | None = head
    for base, new in landed.paths()[rel]:
        done, content = carry(content, landed.blob(base), landed.blob(new))
        if not done:
            return None
    return content


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    prior=st.lists(edit, max_size=2, unique_by=lambda e: e[0]),
    session=st.lists(edit, min_size=1, max_size=3, unique_by=lambda e: e[0]),
    person=st.lists(edit, max_size=3, unique_by=lambda e: e[0]),
    untracked=st.booleans(),
)
def test_the_persons_work_is_never_lost_or_taken(
    tmp_path_factory: pytest.TempPathFactory,
    prior: list[tuple[str, int]],
    session: list[tuple[str, int]],
    person: list[tuple[str, int]],
    untracked: bool,
) -> None:
    root = tmp_path_factory.mktemp("p")
    project, state = root / "project", root / "state"
    (project / "src").mkdir(parents=True)
    for rel in FILES:  # what HEAD has
        (project / rel).write_text("".join(BASE))
    mine: dict[tuple[str, int], str] = {}  # the person's latest text of a line

    def by_person(rel: str, line: int, word: str) -> None:
        lines = (project / rel).read_text().splitlines(keepends=True)
        lines[line] = f"{word} {line}\n"
        (project / rel).write_text("".join(lines))
        mine[rel, line] = f"{word} {line}\n"

    for rel, line in prior:  # uncommitted before the session starts
        by_person(rel, line, "before")
    stage = Staging(root / "stage", project)
    for rel, line in session:  # the session stages its change
        lines = (project / rel).read_text().splitlines(keepends=True)
        lines[line] = f"session {line}\n"
        stage.stage(rel, "".join(lines).encode())
    for rel, line in person:  # the person edits meanwhile
        by_person(rel, line, "person")
    if untracked:
        (project / "notes.txt").write_text("mine\n")
    before = {rel: (project / rel).read_text() for rel in FILES}
    landed = Landed(root / "landed")
    planned = {
        c.path: Change(c.base_sha256, stage.base(c.path), stage.read(c.path))
        for c in stage.changes()
    }
    landed.add(planned)
    try:
        result = Merger(project, state, roots=("src/**",)).merge(stage)
    except MergeOverlap as exc:
        landed.settle([])
        assert {rel: (project / rel).read_text() for rel in FILES} == before  # nothing written
        assert set(exc.paths) <= {rel for rel, _ in person} & {rel for rel, _ in session}
    else:
        landed.settle(result.merged)
        assert result.status == "completed"
        for rel, line in session:
            assert f"session {line}\n" in (project / rel).read_text()
            taken = commit_of(landed, rel, "".join(BASE).encode())
            if taken is None:  # left out: the session's line touches one the person had
                # not committed (the same or the next one: a conflict, as for git)
                assert any(r == rel and abs(p - line) <= 1 for r, p in prior)
                continue
            lines = taken.decode().splitlines(keepends=True)
            assert lines == [f"session {line}\n" if i == line else b for i, b in enumerate(BASE)]
    for (rel, line), text in mine.items():  # never lost (unless the model rewrote the
        # line it saw, which its change was made against)
        assert text in (project / rel).read_text() or (
            text.startswith("before") and (rel, line) in session
        )
    assert set(landed.paths()) <= {rel for rel, _ in session}  # never theirs to commit
    if untracked:
        assert (project / "notes.txt").read_text() == "mine\n"
