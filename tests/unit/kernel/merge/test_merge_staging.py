"""The staging area (the view later sandboxes see) and ingest into it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import fluffy.kernel.merge.staging as staging_module
from fluffy.errors import MergeRefused, PatchRejected
from fluffy.kernel.merge.ingest import ingest
from fluffy.kernel.merge.patch import count_diff_lines, unified_diff
from fluffy.kernel.merge.staging import Staging
from unit.trees import write_tree


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "project", {"src/a.py": "a = 1\n", "old.py": "old\n"})


@pytest.fixture()
def staging(tmp_path: Path, project: Path) -> Staging:
    return Staging(tmp_path / "state/staging/s1", project)


def test_layout_and_view(staging: Staging, project: Path) -> None:
    assert staging.is_empty()
    assert (staging.root / "deleted.txt").read_text() == ""
    assert staging.read("src/a.py") == b"a = 1\n"  # the project shows through
    change = staging.stage("src/a.py", b"a = 2\n")
    assert change is not None and change.op == "write"
    assert change.base_sha256 == sha(b"a = 1\n") and change.sha256 == sha(b"a = 2\n")
    staging.stage("src/pkg/new.py", b"new\n")
    staging.stage("old.py", None)
    assert (staging.tree / "src/a.py").read_bytes() == b"a = 2\n"
    assert (staging.tree / "src/pkg/new.py").read_bytes() == b"new\n"
    assert (staging.root / "deleted.txt").read_text() == "old.py\n"
    assert staging.read("src/a.py") == b"a = 2\n"
    assert staging.read("old.py") is None
    assert staging.read("src/pkg/new.py") == b"new\n"
    assert staging.overlay() == {
        "old.py": None,
        "src/a.py": sha(b"a = 2\n"),
        "src/pkg/new.py": sha(b"new\n"),
    }
    assert [(c.path, c.op, c.base_sha256) for c in staging.changes()] == [
        ("old.py", "delete", sha(b"old\n")),
        ("src/a.py", "write", sha(b"a = 1\n")),
        ("src/pkg/new.py", "write", None),
    ]
    # the project itself is never written by staging
    assert (project / "src/a.py").read_text() == "a = 1\n"
    assert (project / "old.py").exists() and not (project / "src/pkg").exists()
    assert "meta.json" not in [p.name for p in staging.tree.rglob("*")]


def test_base_is_taken_at_first_staging(staging: Staging, project: Path) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    (project / "src/a.py").write_text("a = 'changed by the user'\n")
    change = staging.stage("src/a.py", b"a = 3\n")
    assert change is not None and change.base_sha256 == sha(b"a = 1\n")


def test_staging_back_to_the_project_content_unstages(staging: Staging) -> None:
    staging.stage("src/deep/er/new.py", b"x\n")
    staging.stage("src/a.py", b"a = 2\n")
    assert staging.stage("src/a.py", b"a = 1\n") is None
    assert staging.stage("src/deep/er/new.py", None) is None  # created, then deleted
    staging.stage("old.py", None)
    assert staging.stage("old.py", b"old\n") is None
    assert staging.is_empty()
    assert list(staging.tree.iterdir()) == []  # empty folders pruned too
    assert (staging.root / "deleted.txt").read_text() == ""


def test_diff_and_clear(staging: Staging) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("old.py", None)
    staging.stage("bin.dat", b"\x00\x01\xff")
    diff = staging.diff()
    assert "--- a/src/a.py\n+++ b/src/a.py\n" in diff
    assert "--- a/old.py\n+++ /dev/null\n" in diff
    assert "Binary files /dev/null and b/bin.dat differ\n" in diff
    assert staging.diff_lines() == count_diff_lines(diff) == 3
    only = staging.diff({"old.py"})  # one call's changes
    assert only == "--- a/old.py\n+++ /dev/null\n" + only.split("+++ /dev/null\n", 1)[1]
    assert "src/a.py" not in only and "bin.dat" not in only
    staging.clear()
    assert staging.is_empty() and staging.diff() == ""
    assert list(staging.tree.iterdir()) == []
    assert staging.read("src/a.py") == b"a = 1\n"


def test_reopen_keeps_everything(tmp_path: Path, staging: Staging, project: Path) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("old.py", None)
    again = Staging(staging.root, project)
    assert again.changes() == staging.changes()
    assert again.read("src/a.py") == b"a = 2\n"


def test_reconcile_after_interrupted_stage(staging: Staging, project: Path) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("old.py", None)
    # killed after writing a new tree file, before meta.json named it
    (staging.tree / "orphan.py").write_text("orphan\n")
    # killed after rewriting a staged file, before meta.json got its new hash
    (staging.tree / "src/a.py").write_text("a = 3\n")
    # killed after recording a deletion, before removing the tree file
    (staging.tree / "old.py").write_text("stale\n")
    again = Staging(staging.root, project)
    assert again.overlay() == {"old.py": None, "src/a.py": sha(b"a = 3\n")}
    assert not (staging.tree / "orphan.py").exists()
    assert not (staging.tree / "old.py").exists()
    meta = json.loads((staging.root / "meta.json").read_text())
    assert meta["entries"]["src/a.py"] == [sha(b"a = 1\n"), sha(b"a = 3\n")]


def test_staging_syncs_data_not_folders(staging: Staging, monkeypatch: pytest.MonkeyPatch) -> None:
    """A staged write syncs nothing (ADR-094): not its tree file, not meta.json, not the
    base copy, not their folders; it leaves an unchanged deleted.txt alone.  A deletion
    syncs meta.json before its file goes.  The area repairs itself from what is there."""
    monkeypatch.setattr(staging_module, "BOOT_ID", "this-boot")  # (unknown: synced)
    synced: list[bool] = []  # one per fsync: was it a folder?
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    staging.stage("src/a.py", b"a = 2\n")  # (a new folder is synced when it is made)
    listing = (staging.root / "deleted.txt").stat()
    monkeypatch.setattr(os, "fsync", fsync)
    staging.stage("src/new.py", b"new\n")
    staging.stage("old.py", b"changed\n")  # the project's file: its base is copied
    assert (staging.bases / "old.py").read_bytes() == b"old\n"
    assert synced == []
    after = (staging.root / "deleted.txt").stat()
    assert (after.st_ino, after.st_mtime_ns) == (listing.st_ino, listing.st_mtime_ns)
    staging.stage("old.py", None)
    assert (staging.root / "deleted.txt").read_text() == "old.py\n"
    assert synced[:1] == [False]  # meta.json, before the tree file goes


def test_where_the_boot_is_unknown_a_write_syncs_its_file_and_meta_json(
    staging: Staging, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(staging_module, "BOOT_ID", "")
    synced: list[bool] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    staging.stage("src/a.py", b"a = 2\n")
    monkeypatch.setattr(os, "fsync", fsync)
    staging.stage("src/new.py", b"new\n")
    assert synced == [False, False]  # the file, meta.json
    assert "boot" not in json.loads((staging.root / "meta.json").read_text())


def test_after_a_machine_crash_a_file_that_does_not_match_is_dropped_not_adopted(
    staging: Staging,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Unsynced writes: after a reboot a tree file newer than meta.json may be empty or
    partial, so it is dropped with its entry and base (the change is lost, never half
    kept); a file that matches its entry is kept.  The same boot adopts it (above)."""
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("src/b.py", b"b = 1\n")
    assert json.loads((staging.root / "meta.json").read_text())["boot"] == staging_module.BOOT_ID
    (staging.tree / "src/a.py").write_bytes(b"")  # the crash kept the name, not the data
    monkeypatch.setattr(staging_module, "BOOT_ID", "another-boot")
    with caplog.at_level("WARNING", logger="fluffy.kernel.staging"):
        again = Staging(staging.root, project)
    assert again.lost == ["src/a.py"] and "src/a.py" in caplog.text  # said, not silent
    assert again.overlay() == {"src/b.py": sha(b"b = 1\n")}
    assert again.read("src/a.py") == b"a = 1\n"  # the project's, as before the session
    assert not (staging.tree / "src/a.py").exists() and not (staging.bases / "src/a.py").exists()
    assert Staging(staging.root, project).lost == []  # repaired once, and recorded so


def test_a_write_lost_from_meta_json_is_restored_from_its_tree_file(
    staging: Staging, project: Path
) -> None:
    """A kernel killed in the same boot keeps every completed write (the page cache):
    an older meta.json is brought up to the tree files, an orphan file (its call never
    answered) is removed, and the bases are kept."""
    staging.stage("src/a.py", b"a = 2\n")
    older = (staging.root / "meta.json").read_bytes()
    staging.stage("src/a.py", b"a = 3\n")
    staging.stage("src/new.py", b"new\n")
    (staging.root / "meta.json").write_bytes(older)  # the crash kept the first save only
    again = Staging(staging.root, project)
    assert again.overlay() == {"src/a.py": sha(b"a = 3\n")}  # new.py: lost, never half
    assert again.read("src/a.py") == b"a = 3\n" and again.base("src/a.py") == b"a = 1\n"
    assert not (staging.tree / "src/new.py").exists()
    assert json.loads((staging.root / "meta.json").read_text())["entries"] == {
        "src/a.py": [sha(b"a = 1\n"), sha(b"a = 3\n")]
    }


def test_clearing_the_area_is_synced_in_full(
    staging: Staging, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a merge the log records the area cleared: a crash must not bring the
    merged changes back as staged ones, so clearing syncs its folder too."""
    staging.stage("src/a.py", b"a = 2\n")
    folders: list[bool] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        folders.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    staging.clear()
    assert True in folders


def test_a_lost_rename_of_meta_json_loses_the_write_not_the_area(
    staging: Staging, project: Path
) -> None:
    """A machine crash may keep the previous meta.json (its rename never reached the
    disk): the write it named is dropped on reopening, everything before it stays."""
    staging.stage("src/a.py", b"a = 2\n")
    before = (staging.root / "meta.json").read_bytes()
    staging.stage("src/new.py", b"new\n")
    (staging.root / "meta.json").write_bytes(before)
    again = Staging(staging.root, project)
    assert again.overlay() == {"src/a.py": sha(b"a = 2\n")}
    assert not (staging.tree / "src/new.py").exists()
    assert again.read("src/a.py") == b"a = 2\n"


@pytest.fixture()
def shared_dir() -> Iterator[Path]:
    """A folder another uid can traverse (pytest's tmp_path parents are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="fluffy-staging-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_sandbox_uid_can_read_staging(shared_dir: Path, project: Path) -> None:
    old_umask = os.umask(0o077)  # the kernel's umask must not matter
    try:
        staging = Staging(shared_dir / "staging", project)
        staging.stage("src/pkg/new.py", b"new\n")
        staging.stage("old.py", None)
    finally:
        os.umask(old_umask)
    for path in [staging.root, staging.tree, *staging.tree.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))
    assert stat.S_IMODE((staging.root / "deleted.txt").stat().st_mode) == 0o644
    if os.geteuid() != 0:
        return  # the mode bits above are what the sandbox's uid relies on
    out = subprocess.run(
        ["cat", str(staging.tree / "src/pkg/new.py"), str(staging.root / "deleted.txt")],
        user=10001,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "new\nold.py\n"


# -- ingest ---------------------------------------------------------------------------


def write(call: Path, name: str, data: str) -> str:
    (call / name).parent.mkdir(parents=True, exist_ok=True)
    (call / name).write_text(data)
    return name


@pytest.fixture()
def call(tmp_path: Path) -> Path:
    folder = tmp_path / "output/call-1"
    folder.mkdir(parents=True)
    return folder


def test_ingest_patch_full_delete(call: Path, staging: Staging, project: Path) -> None:
    changes = [
        {
            "path": "tests/test_x.py",
            "op": "patch",
            "file": write(call, "0.diff", unified_diff("tests/test_x.py", None, "x\n")),
        },
        {"path": "src/a.py", "op": "full", "file": write(call, "1.content", "a = 9\n")},
        {"path": "old.py", "op": "delete"},
    ]
    staged = ingest(call, changes, staging)
    assert sorted((c.path, c.op) for c in staged) == [
        ("old.py", "delete"),
        ("src/a.py", "write"),
        ("tests/test_x.py", "write"),
    ]
    assert staging.read("tests/test_x.py") == b"x\n"
    assert staging.read("src/a.py") == b"a = 9\n"
    assert staging.read("old.py") is None
    assert not (project / "tests").exists()


def test_ingest_patches_apply_to_the_view(call: Path, staging: Staging) -> None:
    """A second call's patch applies to the staged content, not to the project's."""
    first = unified_diff("src/a.py", "a = 1\n", "a = 2\n")
    ingest(
        call, [{"path": "src/a.py", "op": "patch", "file": write(call, "0.diff", first)}], staging
    )
    second = unified_diff("src/a.py", "a = 2\n", "a = 2\nb = 3\n")
    ingest(
        call, [{"path": "src/a.py", "op": "patch", "file": write(call, "1.diff", second)}], staging
    )
    assert staging.read("src/a.py") == b"a = 2\nb = 3\n"
    # a patch made against the project (not the view) no longer applies
    stale = unified_diff("src/a.py", "a = 1\n", "a = 5\n")
    with pytest.raises(PatchRejected, match="line 1"):
        ingest(
            call,
            [{"path": "src/a.py", "op": "patch", "file": write(call, "2.diff", stale)}],
            staging,
        )
    assert staging.read("src/a.py") == b"a = 2\nb = 3\n"


def test_ingest_applies_changes_of_one_call_in_order(call: Path, staging: Staging) -> None:
    one = unified_diff("src/a.py", "a = 1\n", "a = 2\n")
    two = unified_diff("src/a.py", "a = 2\n", "a = 3\n")
    changes = [
        {"path": "src/a.py", "op": "patch", "file": write(call, "0.diff", one)},
        {"path": "src/a.py", "op": "patch", "file": write(call, "1.diff", two)},
    ]
    assert [c.sha256 for c in ingest(call, changes, staging)] == [sha(b"a = 3\n")]


def test_ingest_crlf_and_no_newline(call: Path, staging: Staging, project: Path) -> None:
    (project / "win.txt").write_bytes(b"one\r\ntwo\r\nlast")
    patch = unified_diff("win.txt", "one\r\ntwo\r\nlast", "one\r\nTWO\r\nlast\r\n")
    ingest(
        call, [{"path": "win.txt", "op": "patch", "file": write(call, "0.diff", patch)}], staging
    )
    assert staging.read("win.txt") == b"one\r\nTWO\r\nlast\r\n"


def test_ingest_refusals_specific_to_the_view(call: Path, staging: Staging, project: Path) -> None:
    ingest(call, [{"path": "src/lib", "op": "full", "file": write(call, "0", "a file\n")}], staging)
    with pytest.raises(MergeRefused, match="staged file"):
        ingest(call, [{"path": "src/lib/x.py", "op": "full", "file": "0"}], staging)
    ingest(call, [{"path": "pkg/mod.py", "op": "full", "file": "0"}], staging)
    with pytest.raises(MergeRefused, match="folder"):
        ingest(call, [{"path": "pkg", "op": "full", "file": "0"}], staging)
    with pytest.raises(PatchRejected, match="does not exist"):
        ingest(call, [{"path": "nothing.py", "op": "delete"}], staging)
    ingest(call, [{"path": "old.py", "op": "delete"}], staging)
    with pytest.raises(PatchRejected, match="does not exist"):  # already deleted in the view
        ingest(call, [{"path": "old.py", "op": "delete"}], staging)
    (project / "blob.bin").write_bytes(b"\xff\xfe\x00")
    patch = unified_diff("blob.bin", "x\n", "y\n")
    with pytest.raises(PatchRejected, match="UTF-8"):
        ingest(
            call, [{"path": "blob.bin", "op": "patch", "file": write(call, "1", patch)}], staging
        )
    assert sorted(staging.overlay()) == ["old.py", "pkg/mod.py", "src/lib"]


@pytest.mark.parametrize(
    "changes",
    [
        "not a list",
        [["not", "a", "dict"]],
        [{"path": "a", "op": "full"}],  # no file
        [{"path": "a", "op": "delete", "file": "0"}],  # a delete with a file
        [{"path": "a", "op": "full", "file": "0", "mode": "0777"}],  # unknown key
        [{"path": 7, "op": "full", "file": "0"}],
    ],
)
def test_ingest_refuses_malformed_change_lists(
    call: Path, staging: Staging, changes: object
) -> None:
    write(call, "0", "x")
    with pytest.raises(MergeRefused):
        ingest(call, changes, staging)  # type: ignore[arg-type]
    assert staging.is_empty()


def test_a_torn_meta_json_drops_the_area_into_lost_and_it_opens_again(
    staging: Staging, project: Path
) -> None:
    """meta.json is written atomically, so only a machine crash tears it: nothing in the
    area is vouched for, so everything is dropped (and said), and the session goes on."""
    staging.stage("src/a.py", b"a = 2\n")
    staging.stage("src/pkg/new.py", b"new\n")
    (staging.root / "meta.json").write_bytes(b"")
    again = Staging(staging.root, project)
    assert sorted(again.lost) == ["src/a.py", "src/pkg/new.py"]
    assert again.is_empty() and again.read("src/a.py") == b"a = 1\n"
    assert list(again.tree.iterdir()) == [] and not (again.bases / "src/a.py").exists()
    assert again.stage("src/a.py", b"a = 3\n") is not None  # usable again


def test_an_area_from_before_boot_ids_is_vouched_for_by_this_boot_before_any_write(
    staging: Staging, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """meta.json without a boot id was written by a release that synced every write; it
    is rewritten (synced, naming this boot) when the area opens, so an unsynced write
    after it that a crash tears is never adopted on the old file's word."""
    staging.stage("src/a.py", b"a = 2\n")
    meta = json.loads((staging.root / "meta.json").read_text())
    del meta["boot"]
    (staging.root / "meta.json").write_text(json.dumps(meta))
    again = Staging(staging.root, project)
    assert json.loads((staging.root / "meta.json").read_text())["boot"] == staging_module.BOOT_ID
    again.stage("src/a.py", b"a = 3\nb = 3\n")
    older = json.loads((staging.root / "meta.json").read_text())
    older["entries"]["src/a.py"][1] = sha(b"a = 2\n")  # the crash kept the older meta.json
    (staging.root / "meta.json").write_text(json.dumps(older))
    (staging.tree / "src/a.py").write_bytes(b"a = 3\n")  # and half of the new file
    monkeypatch.setattr(staging_module, "BOOT_ID", "after-the-crash")
    after = Staging(staging.root, project)
    assert after.lost == ["src/a.py"] and after.read("src/a.py") == b"a = 1\n"


def test_after_a_machine_crash_a_file_meta_json_never_named_is_lost(
    staging: Staging, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging.stage("src/a.py", b"a = 2\n")
    older = (staging.root / "meta.json").read_bytes()
    staging.stage("src/new.py", b"new\n")  # answered as staged; its meta.json was lost
    (staging.root / "meta.json").write_bytes(older)
    monkeypatch.setattr(staging_module, "BOOT_ID", "after-the-crash")
    again = Staging(staging.root, project)
    assert again.lost == ["src/new.py"] and again.overlay() == {"src/a.py": sha(b"a = 2\n")}
