"""Whatever the person does while a session works, nothing they wrote is lost or taken.

Hypothesis interleaves a person's edits (to the files the session changes and to others,
new untracked files) with a session's staged changes and its merge, and checks: a merge
either lands whole, three-way where both changed a file, or writes nothing and names the
overlapping files; the person's own lines are always in the project afterwards; what the
commit may take (the landed record) is only the session's files (issue 32)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluffy.errors import MergeOverlap
from fluffy.kernel.merge.landed import Landed
from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.merge.staging import Staging

FILES = ("src/a.py", "src/b.py", "src/c.py")
BASE = [f"line {i}\n" for i in range(8)]

edit = st.tuples(st.sampled_from(FILES), st.integers(0, 7))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    session=st.lists(edit, min_size=1, max_size=3, unique_by=lambda e: e[0]),
    person=st.lists(edit, max_size=3, unique_by=lambda e: e[0]),
    untracked=st.booleans(),
)
def test_the_persons_work_is_never_lost_or_taken(
    tmp_path_factory: pytest.TempPathFactory,
    session: list[tuple[str, int]],
    person: list[tuple[str, int]],
    untracked: bool,
) -> None:
    root = tmp_path_factory.mktemp("p")
    project, state = root / "project", root / "state"
    (project / "src").mkdir(parents=True)
    for rel in FILES:
        (project / rel).write_text("".join(BASE))
    stage = Staging(root / "stage", project)
    for rel, line in session:  # the session stages its change
        lines = list(BASE)
        lines[line] = f"session {line}\n"
        stage.stage(rel, "".join(lines).encode())
    mine: dict[str, str] = {}
    for rel, line in person:  # the person edits meanwhile
        lines = (project / rel).read_text().splitlines(keepends=True)
        lines[line] = f"person {line}\n"
        (project / rel).write_text("".join(lines))
        mine[rel] = f"person {line}\n"
    if untracked:
        (project / "notes.txt").write_text("mine\n")
    before = {rel: (project / rel).read_text() for rel in FILES}
    landed = Landed(root / "landed")
    planned = {rel: stage.read(rel) for rel, _ in session}
    landed.add(planned)
    try:
        result = Merger(project, state, roots=("src/**",)).merge(stage)
    except MergeOverlap as exc:
        landed.keep_only([], planned)
        assert {rel: (project / rel).read_text() for rel in FILES} == before  # nothing written
        assert set(exc.paths) <= set(mine) & {rel for rel, _ in session}
    else:
        landed.keep_only(result.merged, planned)
        landed.add(result.three_way)
        assert result.status == "completed"
        for rel, line in session:
            assert f"session {line}\n" in (project / rel).read_text()
            assert landed.content(rel) == (project / rel).read_bytes()  # the commit's
    for rel, text in mine.items():  # never lost
        assert text in (project / rel).read_text()
    assert set(landed.paths()) <= {rel for rel, _ in session}  # never theirs to commit
    if untracked:
        assert (project / "notes.txt").read_text() == "mine\n"
