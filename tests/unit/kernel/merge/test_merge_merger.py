"""Merging staged changes into the project: plan criteria, conflicts, atomicity, the op log."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from fluffy.errors import MergeConflict, MergeError, MergeOverlap, MergeRefused
from fluffy.kernel import confined_files
from fluffy.kernel.confined_files import DEFAULT_SENSITIVE, write_atomic
from fluffy.kernel.merge import merger as merger_module
from fluffy.kernel.merge import staging as staging_module
from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.merge.oplog import MergeOperation, pending
from fluffy.kernel.merge.staging import Staging
from fluffy.kernel.policy.model import parse_policy
from fluffy.kernel.syscalls.assemble_tools import sensitive_paths
from unit.trees import write_tree

#: The fixture project's source and test folders (its Layout.merge_globs).
ROOTS = ("tests/**", "**/test_*.py", "src/**", "/old.py")  # old.py: a module at the top


class Crash(Exception):
    """Stands for the process dying at a chosen point (never caught by the merger)."""


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    files = {"src/a.py": "a = 1\n", "src/b.py": "b = 1\n", "old.py": "old\n"}
    return write_tree(tmp_path / "project", files)


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture()
def staging(state: Path, project: Path) -> Staging:
    return Staging(state / "staging/s1", project)


def files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".fluffy" in p.name or p.name.endswith(".tmp")]


def test_merge_writes_creates_deletes(project: Path, state: Path, staging: Staging) -> None:
    os.chmod(project / "src/a.py", 0o755)
    inode = (project / "src/a.py").stat().st_ino
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("src/new/deep/c.py", b"c\n")
    staging.stage("old.py", None)
    merger = Merger(project, state, roots=ROOTS)
    plan = merger.plan(staging, tests_pass=True)
    assert plan.auto and plan.reasons == []
    assert plan.diff_lines == 4 and "+a = 2" in plan.diff
    result = merger.merge(plan)
    assert result.status == "completed"
    assert sorted(result.merged) == ["old.py", "src/a.py", "src/new/deep/c.py"]
    assert result.conflicts == [] and result.refused == []
    assert files(project) == {
        "src/a.py": b"a = 2\n",
        "src/b.py": b"b = 1\n",
        "src/new/deep/c.py": b"c\n",
    }
    assert stat.S_IMODE((project / "src/a.py").stat().st_mode) == 0o755  # mode kept
    assert (project / "src/a.py").stat().st_ino != inode  # replaced by rename
    assert temp_files(project) == []
    assert staging.is_empty() and list(staging.tree.iterdir()) == []
    record = json.loads((state / "merges" / f"{result.operation_id}.json").read_text())
    assert record["status"] == "completed"
    assert sorted(record["completed_steps"]) == [s["id"] for s in record["steps"]]
    assert not (state / "merges" / str(result.operation_id)).exists()  # sources dropped
    assert pending(state) == []


def test_overlapping_changes_merge_nothing_and_name_both_versions(
    project: Path, state: Path, staging: Staging
) -> None:
    """All of a merge lands or none does (issue 32): the person's edits win, nothing of
    the session's is written, and the error shows both versions of each file."""
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("src/b.py", b"b = 2\n")
    staging.stage("src/new.py", b"mine\n")
    staging.stage("old.py", None)
    (project / "src/a.py").write_text("a = 'the user edited it'\n")
    (project / "src/new.py").write_text("the user created it too\n")
    (project / "old.py").write_text("edited, not to be deleted\n")
    with pytest.raises(MergeOverlap) as caught:
        Merger(project, state, roots=ROOTS).merge(staging)
    assert sorted(caught.value.paths) == ["old.py", "src/a.py", "src/new.py"]
    assert "your change to src/a.py" in caught.value.why
    assert "the session's change to src/a.py" in caught.value.why
    assert (project / "src/a.py").read_text() == "a = 'the user edited it'\n"
    assert (project / "src/new.py").read_text() == "the user created it too\n"
    assert (project / "old.py").read_text() == "edited, not to be deleted\n"
    assert (project / "src/b.py").read_text() == "b = 1\n"  # not even the clean one
    assert not staging.is_empty() and pending(state) == []  # nothing started


def test_a_change_the_person_made_meanwhile_is_merged_three_way(
    project: Path, state: Path, staging: Staging
) -> None:
    """The issue's case: the person appended a line to the file the model changed."""
    (project / "src/calc.py").write_text("def add(a, b):\n    return a + b\n")
    staging.stage("src/calc.py", b"def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"
                  b"    return a - b\n")  # fmt: skip
    staging.stage("tests/test_calc.py", b"from calc import sub\n")
    (project / "src/calc.py").write_text(
        "# the person's header\ndef add(a, b):\n    return a + b\n"
    )
    result = Merger(project, state, roots=ROOTS).merge(staging)
    assert result.status == "completed" and result.three_way == ["src/calc.py"]
    assert sorted(result.merged) == ["src/calc.py", "tests/test_calc.py"]
    assert (project / "src/calc.py").read_text() == (
        "# the person's header\ndef add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"
        "    return a - b\n"
    )
    assert staging.is_empty()


def test_a_file_changed_while_the_merge_writes_rolls_everything_back(
    project: Path, state: Path, staging: Staging
) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("src/b.py", b"b = 2\n")

    def person_edits(op: object, phase: str) -> None:
        if phase == "applied:00000":  # a.py written; the person saves b.py just then
            (project / "src/b.py").write_text("b = 'theirs'\n")

    result = Merger(project, state, roots=ROOTS, on_step=person_edits).merge(staging)
    assert result.status == "failed" and result.merged == []
    assert [c.path for c in result.conflicts] == ["src/b.py"]
    assert (project / "src/a.py").read_text() == "a = 1\n"  # undone
    assert (project / "src/b.py").read_text() == "b = 'theirs'\n"
    assert not staging.is_empty()  # the session's change is kept, to redo


def test_a_save_while_the_new_bytes_are_synced_is_not_replaced(
    project: Path, state: Path, staging: Staging, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The person saves the file after the merge checked it, while the new bytes are on
    their way to disk (the red team's window, inside write_atomic's fsync)."""
    staging.stage("src/b.py", b"b = 2\n")
    real_fsync = os.fsync
    saved: list[str] = []

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if not saved and ".fluffy-merge-" in os.readlink(f"/proc/self/fd/{fd}"):
            (project / "src/b.py").write_text("b = 'theirs'\n")
            saved.append("b")

    monkeypatch.setattr(confined_files.os, "fsync", fsync)
    result = Merger(project, state, roots=ROOTS).merge(staging)
    assert saved == ["b"]
    assert result.status == "failed" and [c.path for c in result.conflicts] == ["src/b.py"]
    assert (project / "src/b.py").read_text() == "b = 'theirs'\n"
    assert not staging.is_empty()
    assert [p.name for p in (project / "src").iterdir() if p.name.endswith(".tmp")] == []


def test_a_save_while_the_roll_back_restores_a_file_is_not_replaced(
    project: Path, state: Path, staging: Staging, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("src/b.py", b"b = 2\n")
    real_fsync = os.fsync
    saved: list[str] = []

    def person_edits(op: object, phase: str) -> None:
        if phase == "applied:00000":  # a.py written; b.py saved: the merge rolls back
            (project / "src/b.py").write_text("b = 'theirs'\n")

    def fsync(fd: int) -> None:
        real_fsync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not saved and "/src/.a.py.fluffy-" in path and "-merge-" not in path:
            (project / "src/a.py").write_text("a = 'theirs'\n")  # during the undo's sync
            saved.append("a")

    monkeypatch.setattr(confined_files.os, "fsync", fsync)
    result = Merger(project, state, roots=ROOTS, on_step=person_edits).merge(staging)
    assert saved == ["a"] and result.status == "failed"
    assert (project / "src/a.py").read_text() == "a = 'theirs'\n"
    assert (project / "src/b.py").read_text() == "b = 'theirs'\n"


def test_same_change_already_in_the_project_is_not_a_conflict(
    project: Path, state: Path, staging: Staging
) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    (project / "src/a.py").write_text("a = 2\n")
    result = Merger(project, state, roots=ROOTS).merge(staging)
    assert result.merged == ["src/a.py"] and result.conflicts == []


def test_target_turned_into_a_symlink_is_refused(
    tmp_path: Path, project: Path, state: Path, staging: Staging
) -> None:
    outside = tmp_path / "outside"
    outside.write_text("victim\n")
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("src/b.py", b"b = 2\n")
    (project / "src/a.py").unlink()
    (project / "src/a.py").symlink_to(outside)
    plan = Merger(project, state, roots=ROOTS).plan(staging, tests_pass=True)
    assert not plan.auto
    assert plan.reasons == ["the project's file cannot be read safely: src/a.py"]
    assert "Unreadable a/src/a.py: the target is a symbolic link" in plan.diff
    with pytest.raises(MergeRefused, match="symbolic link"):
        Merger(project, state, roots=ROOTS).merge(plan)
    assert outside.read_text() == "victim\n"
    assert (project / "src/b.py").read_text() == "b = 1\n"  # all or nothing


def test_protected_at_merge_time(project: Path, state: Path, staging: Staging) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    with pytest.raises(MergeRefused):
        Merger(project, state, roots=ROOTS, protected=["src/**"]).merge(staging)
    assert (project / "src/a.py").read_text() == "a = 1\n"


def test_empty_staging(project: Path, state: Path, staging: Staging) -> None:
    merger = Merger(project, state, roots=ROOTS)
    plan = merger.plan(staging, tests_pass=True)
    assert not plan.auto and plan.reasons == ["nothing is staged"]
    result = merger.merge(staging)
    assert result.status == "empty" and result.operation_id is None


# -- auto-merge criteria ---------------------------------------------------------------


def test_failing_tests_block_auto_merge(project: Path, state: Path, staging: Staging) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    merger = Merger(project, state, roots=ROOTS)
    assert merger.plan(staging, tests_pass=True).auto
    plan = merger.plan(staging, tests_pass=False)
    assert not plan.auto and plan.reasons == ["the tests did not pass"]


@pytest.mark.parametrize(
    "path",
    [
        ".env",
        ".env.production",
        "deploy/server.pem",
        "keys/deploy.key",
        "config/secrets/db.yaml",
        ".github/workflows/ci.yml",
        "pyproject.toml",
        "requirements-dev.txt",
        "Makefile",
    ],
)
def test_sensitive_paths_block_auto_merge(
    project: Path, state: Path, staging: Staging, path: str
) -> None:
    staging.stage(path, b"x\n")
    plan = Merger(project, state, roots=ROOTS).plan(staging, tests_pass=True)
    assert not plan.auto and plan.sensitive == [path]
    assert plan.reasons[0] == f"sensitive paths change: {path}"
    # pyproject.toml also configures the test runner: named as test-support code too
    assert [s.path for s in plan.support] == ([path] if path == "pyproject.toml" else [])


def test_ordinary_paths_are_not_sensitive(project: Path, state: Path, staging: Staging) -> None:
    for path in ("src/env.py", "docs/keys.md", "tests/test_secrets.py", "src/pyproject.py"):
        staging.stage(path, b"x\n")
    plan = Merger(project, state, roots=ROOTS).plan(staging, tests_pass=True)
    assert plan.sensitive == []
    assert plan.outside == ["docs/keys.md"]  # not sensitive, but outside the code and tests


def test_custom_sensitive_globs(project: Path, state: Path, staging: Staging) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    plan = Merger(project, state, roots=ROOTS, sensitive=["src/**"]).plan(staging, tests_pass=True)
    assert plan.sensitive == ["src/a.py"] and not plan.auto


@pytest.mark.parametrize(("lines", "auto"), [(499, True), (500, False), (800, False)])
def test_large_diffs_block_auto_merge(
    project: Path, state: Path, staging: Staging, lines: int, auto: bool
) -> None:
    staging.stage("src/big.py", "".join(f"x{i} = {i}\n" for i in range(lines)).encode())
    plan = Merger(project, state, roots=ROOTS).plan(staging, tests_pass=True)
    assert plan.diff_lines == lines
    assert plan.auto is auto
    assert any(f"{lines} changed lines" in r for r in plan.reasons) is not auto


def test_binary_changes_block_auto_merge(project: Path, state: Path, staging: Staging) -> None:
    staging.stage("assets/logo.png", b"\x89PNG\r\n\x1a\n\x00\x00")
    plan = Merger(project, state, roots=ROOTS).plan(staging, tests_pass=True)
    assert plan.binary == ["assets/logo.png"] and not plan.auto


def test_threshold_is_configurable(project: Path, state: Path, staging: Staging) -> None:
    staging.stage("src/a.py", b"a = 2\nb = 3\n")
    assert (
        not Merger(project, state, roots=ROOTS, max_auto_lines=3)
        .plan(staging, tests_pass=True)
        .auto
    )
    assert Merger(project, state, roots=ROOTS, max_auto_lines=4).plan(staging, tests_pass=True).auto


def test_plan_must_match_the_staging_it_merges(
    project: Path, state: Path, staging: Staging
) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    merger = Merger(project, state, roots=ROOTS)
    plan = merger.plan(staging, tests_pass=True)
    staging.stage("src/b.py", b"unreviewed\n")
    with pytest.raises(MergeConflict, match="reviewed plan"):
        merger.merge(plan)
    assert (project / "src/a.py").read_text() == "a = 1\n"
    assert pending(state) == []


# -- interruption, in process ---------------------------------------------------------


def crash_at(phase: str) -> merger_module.Hook:
    def hook(op: MergeOperation, at: str) -> None:
        if at == phase:
            raise Crash(at)

    return hook


def test_crash_after_rename_before_record(project: Path, state: Path, staging: Staging) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("src/b.py", b"b = 2\n")
    with pytest.raises(Crash):
        Merger(project, state, roots=ROOTS, on_step=crash_at("applied:00001")).merge(staging)
    [op] = pending(state)
    assert op.completed_steps == ["00000"]
    assert (project / "src/b.py").read_text() == "b = 2\n"  # written, not yet recorded
    seen: list[str] = []
    [result] = Merger(
        project, state, roots=ROOTS, on_step=lambda _op, at: seen.append(at)
    ).resume_pending()
    assert seen == ["before:00001", "applied:00001", "recorded:00001", "completed"]
    assert result.status == "completed" and result.conflicts == []
    assert sorted(result.merged) == ["src/a.py", "src/b.py"]
    done = Merger(project, state, roots=ROOTS).log.load(op.id)
    assert done.completed_steps == ["00000", "00001"]
    assert done.results["00001"].outcome == "already"  # detected by its sha256, just marked
    assert Merger(project, state, roots=ROOTS).resume_pending() == []  # never applied again
    assert temp_files(project) == []


def test_crash_before_staging_was_cleared(project: Path, state: Path, staging: Staging) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    with pytest.raises(Crash):
        Merger(project, state, roots=ROOTS, on_step=crash_at("prepared")).merge(staging)
    assert not staging.is_empty()
    [result] = Merger(project, state, roots=ROOTS).resume_pending()
    assert result.merged == ["src/a.py"]
    assert Staging(staging.root, project).is_empty()  # the resumed merge cleared it
    assert (project / "src/a.py").read_text() == "a = 2\n"


def test_a_machine_crash_before_staging_was_cleared_still_clears_it(
    project: Path, state: Path, staging: Staging, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A staged write is not synced (ADR-094): after a reboot the area drops a merged
    file whose data was lost, and the resumed merge must still clear what it merged."""
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("src/new.py", b"new\n")
    with pytest.raises(Crash):
        Merger(project, state, roots=ROOTS, on_step=crash_at("completed")).merge(staging)
    (staging.tree / "src/new.py").write_bytes(b"")  # its data never reached the disk
    monkeypatch.setattr(staging_module, "BOOT_ID", "after-the-crash")
    Merger(project, state, roots=ROOTS).resume_pending()
    assert Staging(staging.root, project).is_empty()  # merged changes never come back
    assert (project / "src/new.py").read_bytes() == b"new\n"


def test_os_error_leaves_the_operation_to_resume(
    project: Path, state: Path, staging: Staging, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("src/b.py", b"b = 2\n")
    calls: list[str] = []

    def flaky(base: Path, rel: str, data: bytes, **kwargs: object) -> None:
        calls.append(rel)
        if rel == "src/b.py" and calls.count(rel) == 1:
            raise OSError(28, "No space left on device")
        write_atomic(base, rel, data, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(merger_module, "write_atomic", flaky)
    with pytest.raises(MergeError, match="No space left"):
        Merger(project, state, roots=ROOTS).merge(staging)
    [op] = pending(state)
    assert op.completed_steps == ["00000"]
    [result] = Merger(project, state, roots=ROOTS).resume_pending()
    assert result.status == "completed"
    assert (project / "src/b.py").read_text() == "b = 2\n"


def test_lost_source_fails_the_operation(project: Path, state: Path, staging: Staging) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    with pytest.raises(Crash):
        Merger(project, state, roots=ROOTS, on_step=crash_at("before:00000")).merge(staging)
    [op] = pending(state)
    (state / "merges" / op.id / "00000.content").unlink()
    [result] = Merger(project, state, roots=ROOTS).resume_pending()
    assert result.status == "failed" and result.error and "lost its source" in result.error
    assert (project / "src/a.py").read_text() == "a = 1\n"
    assert pending(state) == []


def test_pending_is_oldest_first_and_garbage_is_collected(
    project: Path, state: Path, tmp_path: Path
) -> None:
    times = iter([200.0, 100.0])
    for name in ("one", "two"):
        stage = Staging(tmp_path / f"staging-{name}", project)
        stage.stage(f"{name}.txt", name.encode())
        merger = Merger(
            project, state, roots=ROOTS, on_step=crash_at("prepared"), clock=lambda: next(times)
        )
        with pytest.raises(Crash):
            merger.merge(stage)
    assert [op.created_at for op in pending(state)] == [100.0, 200.0]
    (state / "merges" / "never-started").mkdir()  # sources copied, op JSON never written
    results = Merger(project, state, roots=ROOTS).resume_pending()
    assert [r.merged for r in results] == [["two.txt"], ["one.txt"]]
    assert sorted(p.name for p in (state / "merges").iterdir() if p.is_dir()) == []


@pytest.mark.parametrize("path", [".env", ".envrc", ".github/workflows/ci.yml", "deploy.pem"])
def test_a_policy_adds_sensitive_paths_but_never_removes_fluffys(
    project: Path, state: Path, staging: Staging, path: str
) -> None:
    """A cloned repository's own policy saying nothing is sensitive and everything merges
    by itself: the person's secrets and CI files still wait for them."""
    policy = parse_policy(
        "merge:\n  sensitive_paths: ['docs/**', '!**', '!.env']\n  auto_merge_paths: ['**']\n",
        "<repo>",
    )
    staging.stage(path, b"x\n")
    staging.stage("docs/a.md", b"x\n")
    sensitive = sensitive_paths(policy)
    plan = Merger(project, state, roots=ROOTS, sensitive=sensitive, auto_merge=["**"]).plan(
        staging, tests_pass=True
    )
    assert not plan.auto and sorted(plan.sensitive) == sorted([path, "docs/a.md"])
    empty = parse_policy("merge:\n  sensitive_paths: []\n", "<repo>")
    assert sensitive_paths(empty) == list(DEFAULT_SENSITIVE)
