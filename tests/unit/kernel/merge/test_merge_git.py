"""Merging a git.commit sandbox's output into a real repository, checked with real git.

The sandbox side is reproduced with git itself: the project's repo is read through
GIT_ALTERNATE_OBJECT_DIRECTORIES while GIT_OBJECT_DIRECTORY and GIT_INDEX_FILE point into
an output folder, exactly what a sandbox with a read-only project mount can do.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import MergeConflict, MergeRefused
from fluffy.kernel import confined_files
from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.merge.oplog import MergeOperation, pending

IDENTITY = {
    "GIT_AUTHOR_NAME": "fluffy",
    "GIT_AUTHOR_EMAIL": "fluffy@example.invalid",
    "GIT_COMMITTER_NAME": "fluffy",
    "GIT_COMMITTER_EMAIL": "fluffy@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, "HOME": str(repo.parent), **IDENTITY, **(env or {})}
    out = subprocess.run(
        ["git", *args], cwd=repo, env=full, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "a.txt").write_text("one\n")
    (root / "src").mkdir()
    (root / "src/mod.py").write_text("x = 1\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return root


def sandbox_commit(repo: Path, out: Path, message: str = "change") -> dict[str, Any]:
    """What the git.commit sandbox does: commit the work tree without writing .git."""
    objects = out / "git-objects"
    objects.mkdir(parents=True)
    env = {
        "GIT_DIR": str(repo / ".git"),
        "GIT_WORK_TREE": str(repo),
        "GIT_INDEX_FILE": str(out / "git-index"),
        "GIT_OBJECT_DIRECTORY": str(objects),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(repo / ".git/objects"),
    }
    parent = git(repo, "rev-parse", "--verify", "-q", "HEAD", env=env) if has_head(repo) else None
    if parent:
        git(repo, "read-tree", "HEAD", env=env)
    git(repo, "add", "-A", env=env)
    tree = git(repo, "write-tree", env=env)
    args = ["commit-tree", tree, "-m", message] + (["-p", parent] if parent else [])
    commit = git(repo, *args, env=env)
    index = repo / ".git" / "index"
    return {
        "commit": commit,
        "parent": parent,
        "ref": "refs/heads/main",
        "objects": "git-objects",
        "index": "git-index",
        # the person's index it was made from: the kernel swaps it in only if unchanged
        "index_base": hashlib.sha256(index.read_bytes()).hexdigest() if index.exists() else None,
    }


def has_head(repo: Path) -> bool:
    result = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=repo, capture_output=True
    )
    return result.returncode == 0


def git_state(repo: Path) -> dict[str, bytes]:
    """Every file under .git (what a refused merge must leave exactly as it was)."""
    root = repo / ".git"
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_clean_and_valid(repo: Path, commit: str) -> None:
    assert git(repo, "rev-parse", "HEAD") == commit
    assert git(repo, "log", "--format=%H", "-1", "main") == commit
    assert git(repo, "status", "--porcelain") == ""
    git(repo, "fsck", "--strict", "--no-dangling")
    leftovers = [p for p in (repo / ".git").rglob("*") if "fluffy" in p.name]
    assert leftovers == []


def change_work_tree(repo: Path) -> None:
    """The files the earlier file merge wrote (the commit records them)."""
    (repo / "a.txt").write_text("one\ntwo\n")
    (repo / "src/new.py").write_text("y = 2\n")
    (repo / "src/mod.py").unlink()


def test_merge_commit(tmp_path: Path, repo: Path) -> None:
    change_work_tree(repo)
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    before = git(repo, "rev-parse", "HEAD")
    merged = Merger(repo, tmp_path / "state").merge_git(out, result)
    assert merged.status == "completed" and merged.conflicts == [] and merged.refused == []
    assert sorted(merged.merged) == ["index", "objects", "refs/heads/main"]
    assert_clean_and_valid(repo, result["commit"])
    assert git(repo, "rev-parse", "HEAD~1") == before
    assert sorted(git(repo, "show", "--name-status", "--format=", "HEAD").splitlines()) == [
        "A\tsrc/new.py",
        "D\tsrc/mod.py",
        "M\ta.txt",
    ]
    blob = git(repo, "rev-parse", "HEAD:src/new.py")
    assert oct((repo / ".git/objects" / blob[:2] / blob[2:]).stat().st_mode & 0o777) == "0o444"
    assert pending(tmp_path / "state") == []


def test_the_persons_index_changed_meanwhile_is_kept(tmp_path: Path, repo: Path) -> None:
    """The person ran `git add` while the commit was made: the branch moves, their index
    stays theirs, and the result says why and what to do."""
    change_work_tree(repo)
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    (repo / "notes.txt").write_text("mine\n")
    git(repo, "add", "notes.txt")
    theirs = (repo / ".git" / "index").read_bytes()
    merged = Merger(repo, tmp_path / "state").merge_git(out, result)
    assert merged.status == "completed" and sorted(merged.merged) == ["objects", "refs/heads/main"]
    assert git(repo, "rev-parse", "HEAD") == result["commit"]
    assert (repo / ".git" / "index").read_bytes() == theirs
    assert merged.notes and "git reset" in merged.notes[0]


def test_initial_commit(tmp_path: Path) -> None:
    repo = tmp_path / "fresh"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "hello.txt").write_text("hi\n")
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    assert result["parent"] is None
    Merger(repo, tmp_path / "state").merge_git(out, result)
    assert_clean_and_valid(repo, result["commit"])


def test_packed_refs_and_packed_objects(tmp_path: Path, repo: Path) -> None:
    git(repo, "gc", "-q")  # refs into packed-refs, objects into a pack
    assert not (repo / ".git/refs/heads/main").exists()
    assert (repo / ".git/packed-refs").exists()
    (repo / "src/more.py").write_text("z = 3\n")  # the tree shares packed subtrees/blobs
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    Merger(repo, tmp_path / "state").merge_git(out, result)
    assert_clean_and_valid(repo, result["commit"])


def test_stale_parent_is_a_conflict(tmp_path: Path, repo: Path) -> None:
    change_work_tree(repo)
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    (repo / "other.txt").write_text("meanwhile\n")  # the branch moves on
    git(repo, "add", "other.txt")
    git(repo, "commit", "-q", "-m", "meanwhile")
    before = git_state(repo)
    with pytest.raises(MergeConflict) as info:
        Merger(repo, tmp_path / "state").merge_git(out, result)
    assert "compare-and-swap" in info.value.why
    assert git_state(repo) == before
    assert pending(tmp_path / "state") == []


def test_ref_moving_during_the_merge_is_a_conflict(tmp_path: Path, repo: Path) -> None:
    change_work_tree(repo)
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    head = git(repo, "rev-parse", "HEAD")

    def move_branch(op: MergeOperation, phase: str) -> None:
        if phase == "before:ref":
            (repo / "x.txt").write_text("x\n")
            git(repo, "add", "x.txt")
            git(repo, "commit", "-q", "-m", "raced")

    merged = Merger(repo, tmp_path / "state", on_step=move_branch).merge_git(out, result)
    assert [c.path for c in merged.conflicts] == ["refs/heads/main"]
    assert "index" not in merged.merged  # the index is kept when the ref was not moved
    assert git(repo, "rev-parse", "HEAD~1") == head  # the racing commit stands
    git(repo, "fsck", "--strict")


def rewrite_object(out: Path, sha: str, raw: bytes) -> None:
    path = out / "git-objects" / sha[:2] / sha[2:]
    path.chmod(0o644)
    path.write_bytes(zlib.compress(raw))


def blob_of(repo: Path, out: Path, result: dict[str, Any], name: str) -> str:
    env = {"GIT_OBJECT_DIRECTORY": str(out / "git-objects")}
    env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(repo / ".git/objects")
    return git(repo, "rev-parse", f"{result['commit']}:{name}", env=env)


CORRUPTIONS = {
    "content does not match its name": "does not hash to its name",
    "not zlib": "not zlib data",
    "wrong length header": "<type> <length>",
    "trailing data": "followed by other data",
    "symlink in objects": "not a loose object file",
    "stray file in objects": "only folders",
    "missing blob": "which is nowhere",
    "parent differs": "are not [",
    "commit missing": "is not among the objects",
    "bad index checksum": "checksum",
    "index is a symlink": "symbolic link",
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS))
def test_corrupt_output_is_refused(tmp_path: Path, repo: Path, corrupt: str) -> None:
    change_work_tree(repo)
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    blob = blob_of(repo, out, result, "src/new.py")
    obj = out / "git-objects" / blob[:2] / blob[2:]
    if corrupt == "content does not match its name":
        rewrite_object(out, blob, b"blob 6\0y = 3\n")
    elif corrupt == "not zlib":
        obj.chmod(0o644)
        obj.write_bytes(b"plain text")
    elif corrupt == "wrong length header":
        rewrite_object(out, blob, b"blob 99\0y = 2\n")
    elif corrupt == "trailing data":
        obj.chmod(0o644)
        obj.write_bytes(zlib.compress(b"blob 6\0y = 2\n") + b"junk")
    elif corrupt == "symlink in objects":
        obj.unlink()
        obj.symlink_to("/etc/passwd")
    elif corrupt == "stray file in objects":
        (out / "git-objects/hooks").write_text("#!/bin/sh\n")
    elif corrupt == "missing blob":
        obj.unlink()
    elif corrupt == "parent differs":
        result["parent"] = git(repo, "rev-parse", "HEAD")  # true parent...
        git(repo, "commit", "-q", "--allow-empty", "-m", "moved")
        result["parent"] = git(repo, "rev-parse", "HEAD")  # ...but the commit says another
    elif corrupt == "commit missing":
        commit = result["commit"]
        (out / "git-objects" / commit[:2] / commit[2:]).unlink()
    elif corrupt == "bad index checksum":
        data = bytearray((out / "git-index").read_bytes())
        data[20] ^= 0xFF
        (out / "git-index").write_bytes(bytes(data))
    elif corrupt == "index is a symlink":
        (out / "git-index").unlink()
        (out / "git-index").symlink_to(repo / ".git/index")
    before = git_state(repo)
    with pytest.raises(MergeRefused) as info:
        Merger(repo, tmp_path / "state").merge_git(out, result)
    assert CORRUPTIONS[corrupt] in info.value.what
    assert git_state(repo) == before
    assert pending(tmp_path / "state") == []


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("ref", "refs/heads/../../hooks/x", "named the ref"),
        ("ref", "HEAD", "named the ref"),
        ("ref", "refs/heads/other", "HEAD does not point"),
        ("ref", "refs/heads/main.lock", "named the ref"),
        ("commit", "not-a-sha", "not a 40-hex"),
        ("parent", "ABCDEF" * 7, "not a 40-hex"),
        ("objects", "../elsewhere", "'..'"),
    ],
)
def test_bad_result_fields(tmp_path: Path, repo: Path, key: str, value: str, expected: str) -> None:
    (repo / "a.txt").write_text("changed\n")
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    result[key] = value
    before = git_state(repo)
    with pytest.raises(MergeRefused) as info:
        Merger(repo, tmp_path / "state").merge_git(out, result)
    assert expected in info.value.what
    assert git_state(repo) == before


def test_git_lock_is_respected(tmp_path: Path, repo: Path) -> None:
    (repo / "a.txt").write_text("changed\n")
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    (repo / ".git/index.lock").write_text("")
    with pytest.raises(MergeConflict, match="busy"):
        Merger(repo, tmp_path / "state").merge_git(out, result)
    (repo / ".git/index.lock").unlink()
    Merger(repo, tmp_path / "state").merge_git(out, result)
    assert_clean_and_valid(repo, result["commit"])


@pytest.mark.parametrize("phase", ["prepared", "applied:objects", "applied:ref", "applied:index"])
def test_interrupted_git_merge_resumes(tmp_path: Path, repo: Path, phase: str) -> None:
    change_work_tree(repo)
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)

    def crash(op: MergeOperation, at: str) -> None:
        if at == phase:
            raise KeyboardInterrupt  # like a kill: nothing after this point runs

    with pytest.raises(KeyboardInterrupt):
        Merger(repo, tmp_path / "state", on_step=crash).merge_git(out, result)
    shutil.rmtree(out)  # the output volume is gone; the op is self-contained
    [resumed] = Merger(repo, tmp_path / "state").resume_pending()
    assert resumed.status == "completed" and resumed.conflicts == []
    assert_clean_and_valid(repo, result["commit"])
    assert Merger(repo, tmp_path / "state").resume_pending() == []


@pytest.mark.parametrize("lock", ["refs/heads/main", "index"])
def test_git_cannot_take_its_lock_while_the_merge_writes(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch, lock: str
) -> None:
    """A `git add` or `git commit` started while the merge writes the index or the branch
    (after its checks, while the new bytes are synced): the merge writes through git's
    own lock file, so git finds it taken and stops, instead of both writing."""
    (repo / "a.txt").write_text("changed\n")
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    real_fsync = os.fsync
    tried: list[str] = []

    def fsync(fd: int) -> None:
        real_fsync(fd)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.startswith(str(repo / ".git" / lock)) and not tried:
            try:  # what git does first: take the lock
                os.close(os.open(repo / f".git/{lock}.lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                tried.append("git took the lock")
            except FileExistsError:
                tried.append("git found it taken")

    monkeypatch.setattr(confined_files.os, "fsync", fsync)
    done = Merger(repo, tmp_path / "state").merge_git(out, result)
    assert tried == ["git found it taken"]
    assert done.conflicts == [] and not (repo / f".git/{lock}.lock").exists()
    assert_clean_and_valid(repo, result["commit"])


@pytest.mark.parametrize("lock", ["refs/heads/main", "index"])
def test_a_lock_a_killed_merge_left_with_its_own_bytes_is_taken_back(
    tmp_path: Path, repo: Path, lock: str
) -> None:
    """A kill between writing `<name>.lock` and renaming it leaves the lock (as a killed
    git does): the resumed merge knows its own bytes, finishes, and git is not blocked."""
    change_work_tree(repo)
    out = tmp_path / "output/call-1"
    result = sandbox_commit(repo, out)
    step = "objects" if lock != "index" else "ref"

    def crash(op: MergeOperation, at: str) -> None:
        if at == f"recorded:{step}":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Merger(repo, tmp_path / "state", on_step=crash).merge_git(out, result)
    left = (out / "git-index").read_bytes() if lock == "index" else f"{result['commit']}\n"
    (repo / f".git/{lock}.lock").write_bytes(left if isinstance(left, bytes) else left.encode())
    shutil.rmtree(out)
    [resumed] = Merger(repo, tmp_path / "state").resume_pending()
    assert resumed.status == "completed" and resumed.conflicts == []
    assert not (repo / f".git/{lock}.lock").exists()
    assert_clean_and_valid(repo, result["commit"])
