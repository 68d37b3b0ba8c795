"""The git tool plugin (git.status, git.diff, git.commit) against a real repository in
temp folders standing in for the sandbox's mounts."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fluffy.plugins.sdk import Roots
from tests.unit.builtin_support import call, error, git, ok, put, snapshot


@pytest.fixture()
def roots(tmp_path: Path) -> Roots:
    roots = Roots(tmp_path / "workspace", tmp_path / "staged", tmp_path / "output")
    for folder in (roots.workspace, roots.staged, roots.output):
        folder.mkdir(parents=True)
    return roots


@pytest.fixture()
def repo(roots: Roots) -> Roots:
    put(roots.workspace, {"a.txt": "one\n", "b.txt": "two\n"})
    git(roots.workspace, "init", "-q", "-b", "main")
    git(roots.workspace, "add", "-A")
    git(roots.workspace, "commit", "-q", "-m", "first")
    put(roots.workspace, {"a.txt": "one changed\n", "new.txt": "new\n"})
    # Files changed in the same second as git.commit's temporary index are "racily clean":
    # git hashes them again and, finding the object in the project's store, "freshens" it
    # (utime).  In the sandbox the store is read-only and that fails harmlessly; here it
    # would touch the store, so the files are dated back as a real project's are.
    past = time.time() - 10
    for name in ("a.txt", "b.txt", "new.txt"):
        os.utime(roots.workspace / name, (past, past))
    return roots


def test_git_status_and_diff(repo: Roots) -> None:
    before = snapshot(repo.workspace)
    status = ok(call(repo, "git.status", {}))
    assert status["branch"] == "main" and status["clean"] is False
    assert status["head"] == git(repo.workspace, "rev-parse", "HEAD").strip()
    assert status["entries"] == [
        {"path": "a.txt", "status": " M"},
        {"path": "new.txt", "status": "??"},
    ]
    diff = ok(call(repo, "git.diff", {}))["diff"]
    assert "--- a/a.txt\n+++ b/a.txt" in diff and "+one changed" in diff
    assert ok(call(repo, "git.diff", {"paths": ["b.txt"]}))["diff"] == ""
    assert ok(call(repo, "git.diff", {"cached": True}))["diff"] == ""
    bad = call(repo, "git.diff", {"paths": ["../etc"]})
    error(bad, "tool.input_invalid")
    assert snapshot(repo.workspace) == before


PERSON = {"name": "Ann Person", "email": "ann@example.org"}


def landed(roots: Roots, contents: dict[str, bytes | None]) -> dict[str, Any]:
    """What the kernel hands git.commit: the session's merged paths (kernel/merge/landed)."""
    from fluffy.kernel.merge.landed import Landed

    record = Landed(roots.staged)  # mounted at /staged for git.commit
    record.add(contents)
    return {"commit": {"paths": record.paths(), "author": PERSON,
                       "message": "Change b\n\nAssisted-by: fluffy\n"}}  # fmt: skip


def test_git_commit_holds_only_what_the_session_merged(repo: Roots) -> None:
    """The person's uncommitted edit (a.txt, staged too), their untracked files (new.txt,
    .env) stay out of the commit; their index changes for the committed path only."""
    put(repo.workspace, {"b.txt": "two merged\n", ".env": "TOKEN=secret\n"})
    git(repo.workspace, "add", "a.txt")  # the person staged their own edit
    head = git(repo.workspace, "rev-parse", "HEAD").strip()
    index = (repo.workspace / ".git" / "index").read_bytes()
    before = snapshot(repo.workspace)
    order = landed(repo, {"b.txt": b"two merged\n"})
    result = ok(call(repo, "git.commit", {"message": "Change b"}, settings=order))
    assert snapshot(repo.workspace) == before  # nothing written under the project
    assert result["parent"] == head and result["ref"] == "refs/heads/main"
    assert result["files"] == ["b.txt"] and result["author"] == "Ann Person <ann@example.org>"
    assert result["index_base"] == hashlib.sha256(index).hexdigest()
    objects = repo.output / "c1" / result["objects"]
    alt = {
        "GIT_OBJECT_DIRECTORY": str(objects),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(repo.workspace / ".git" / "objects"),
    }
    with pytest.raises(subprocess.CalledProcessError):  # not in the project's own objects
        git(repo.workspace, "cat-file", "-e", result["commit"])
    shown = git(repo.workspace, "cat-file", "-p", result["commit"], **alt)
    assert "author Ann Person <ann@example.org>" in shown
    assert "committer Ann Person <ann@example.org>" in shown
    assert shown.endswith("Change b\n\nAssisted-by: fluffy\n")
    listed = git(repo.workspace, "ls-tree", "-r", "--name-only", result["commit"], **alt)
    assert listed.split() == ["a.txt", "b.txt"]  # no new.txt, no .env
    old_a = git(repo.workspace, "show", f"{head}:a.txt")
    assert git(repo.workspace, "show", f"{result['commit']}:a.txt", **alt) == old_a
    person = {**alt, "GIT_INDEX_FILE": str(repo.output / "c1" / result["index"])}
    staged = git(repo.workspace, "diff", "--cached", "--name-only", result["commit"], **person)
    assert staged.split() == ["a.txt"]  # the person's staged edit is still staged
    assert git(repo.workspace, "rev-parse", "HEAD").strip() == head  # the ref is the kernel's


def test_git_commit_refusals(repo: Roots) -> None:
    message = error(call(repo, "git.commit", {"message": "m"}), "tool.failed")
    assert "no list of merged paths" in message  # never a commit of the whole tree
    same = landed(repo, {"b.txt": b"two\n"})  # what HEAD already has
    again = error(call(repo, "git.commit", {"message": "m"}, "c2", settings=same), "tool.failed")
    assert "nothing to commit" in again and "Fix:" in again
    forged = landed(repo, {"b.txt": b"x\n"})
    (repo.staged / "tree" / "b.txt").write_text("changed behind the record\n")
    bad = error(call(repo, "git.commit", {"message": "m"}, "c3", settings=forged), "tool.failed")
    assert "not the one the merge recorded" in bad
    order = landed(repo, {"b.txt": b"y\n"})
    order["commit"]["author"] = {"name": "a <b>", "email": "e@x"}
    error(call(repo, "git.commit", {"message": "m"}, "c4", settings=order), "tool.input_invalid")
    unknown = call(repo, "git.commit", {"message": "m", "author_name": "Ann"}, "c5")
    error(unknown, "tool.input_invalid")  # the model does not choose the author


def test_git_commit_in_a_repository_without_commits(roots: Roots) -> None:
    put(roots.workspace, {"a.txt": "x\n", "d/b.txt": "y\n"})
    message = error(call(roots, "git.commit", {"message": "m"}), "tool.failed")
    assert "not a git repository" in message
    git(roots.workspace, "init", "-q", "-b", "main")
    assert ok(call(roots, "git.status", {}))["head"] is None
    order = landed(roots, {"a.txt": b"x\n"})
    result = ok(call(roots, "git.commit", {"message": "root"}, "c2", settings=order))
    assert result["parent"] is None and result["ref"] == "refs/heads/main"
    assert result["files"] == ["a.txt"] and result["index_base"] is None  # d/b.txt is not
