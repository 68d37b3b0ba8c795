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
from tests.unit.builtin_support import call, error, git, ok, snapshot
from tests.unit.trees import write_tree


@pytest.fixture()
def roots(tmp_path: Path) -> Roots:
    roots = Roots(tmp_path / "workspace", tmp_path / "staged", tmp_path / "output")
    for folder in (roots.workspace, roots.staged, roots.output):
        folder.mkdir(parents=True)
    return roots


@pytest.fixture()
def repo(roots: Roots) -> Roots:
    write_tree(roots.workspace, {"a.txt": "one\n", "b.txt": "two\n"})
    git(roots.workspace, "init", "-q", "-b", "main")
    git(roots.workspace, "add", "-A")
    git(roots.workspace, "commit", "-q", "-m", "first")
    write_tree(roots.workspace, {"a.txt": "one changed\n", "new.txt": "new\n"})
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


Change = tuple[bytes | None, bytes | None]  # (what the change was made against, new)


def landed(roots: Roots, changes: dict[str, Change | list[Change]]) -> dict[str, Any]:
    """What the kernel hands git.commit: the session's merged changes (kernel/merge/landed)."""
    from fluffy.kernel.merge.landed import Change as Step
    from fluffy.kernel.merge.landed import Landed

    record = Landed(roots.staged)  # mounted at /staged for git.commit
    for rel, steps in changes.items():
        for base, new in steps if isinstance(steps, list) else [steps]:
            sha = None if base is None else hashlib.sha256(base).hexdigest()
            record.add({rel: Step(sha, base, new)})
    return {"commit": {"paths": record.paths(), "author": PERSON,
                       "message": "Change b\n\nAssisted-by: fluffy\n"}}  # fmt: skip


def test_git_commit_holds_only_what_the_session_merged(repo: Roots) -> None:
    """The person's uncommitted edit (a.txt, staged too), their untracked files (new.txt,
    .env) stay out of the commit; their index changes for the committed path only."""
    write_tree(repo.workspace, {"b.txt": "two merged\n", ".env": "TOKEN=secret\n"})
    git(repo.workspace, "add", "a.txt")  # the person staged their own edit
    head = git(repo.workspace, "rev-parse", "HEAD").strip()
    index = (repo.workspace / ".git" / "index").read_bytes()
    before = snapshot(repo.workspace)
    order = landed(repo, {"b.txt": (b"two\n", b"two merged\n")})
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
    order = landed(repo, {"b.txt": (b"two\n", b"y\n")})
    order["commit"]["author"] = {"name": "a <b>", "email": "e@x"}
    error(call(repo, "git.commit", {"message": "m"}, "c4", settings=order), "tool.input_invalid")
    unknown = call(repo, "git.commit", {"message": "m", "author_name": "Ann"}, "c6")
    error(unknown, "tool.input_invalid")  # the model does not choose the author


def test_a_damaged_record_leaves_its_path_to_the_person(repo: Roots) -> None:
    """Changed behind the record, missing, or not a hash: that path is not committed (a
    note says so), nor the rest of the change, and later commits are not blocked."""
    forged = landed(repo, {"b.txt": (b"two\n", b"x\n"), "a.txt": (b"one\n", b"one more\n")})
    (repo.staged / "blobs" / hashlib.sha256(b"x\n").hexdigest()).write_text("behind\n")
    result = ok(call(repo, "git.commit", {"message": "m"}, "c3", settings=forged))
    assert result["commit"] is None and result["left_out"] == ["b.txt", "a.txt"]
    assert "record of the change is damaged" in result["notes"][0]
    (repo.staged / "landed.json").unlink()
    order = landed(repo, {"b.txt": (b"two\n", b"y\n")})
    order["commit"]["paths"]["b.txt"] = [["not a sha", None]]
    result = ok(call(repo, "git.commit", {"message": "m"}, "c5", settings=order))
    assert result["commit"] is None and result["left_out"] == ["b.txt"]


def test_git_commit_of_what_head_already_has_commits_nothing(repo: Roots) -> None:
    """The person committed the very change themselves: nothing is left to commit, which
    is said, and is no failure (the session is done)."""
    same = landed(repo, {"b.txt": (b"two\n", b"two\n")})
    result = ok(call(repo, "git.commit", {"message": "m"}, "c2", settings=same))
    assert result["commit"] is None and result["files"] == [] and result["left_out"] == []
    assert "already has every change" in result["notes"][0]


def test_git_commit_in_a_repository_without_commits(roots: Roots) -> None:
    write_tree(roots.workspace, {"a.txt": "x\n", "d/b.txt": "y\n"})
    message = error(call(roots, "git.commit", {"message": "m"}), "tool.failed")
    assert "not a git repository" in message
    git(roots.workspace, "init", "-q", "-b", "main")
    assert ok(call(roots, "git.status", {}))["head"] is None
    order = landed(roots, {"a.txt": (None, b"x\n")})
    result = ok(call(roots, "git.commit", {"message": "root"}, "c2", settings=order))
    assert result["parent"] is None and result["ref"] == "refs/heads/main"
    assert result["files"] == ["a.txt"] and result["index_base"] is None  # d/b.txt is not


# -- the person's lines in a file the session changed ---------------------------------
LINES = [f"line {i}\n" for i in range(10)]


def text(**changed: str) -> bytes:
    """LINES with some lines replaced (``l3="x\\n"`` replaces line 3)."""
    lines = list(LINES)
    for key, value in changed.items():
        lines[int(key[1:])] = value
    return "".join(lines).encode()


@pytest.fixture()
def lines(roots: Roots) -> Roots:
    write_tree(roots.workspace, {"c.py": text(), "d.py": text(), "e.py": text()})
    git(roots.workspace, "init", "-q", "-b", "main")
    git(roots.workspace, "add", "-A")
    git(roots.workspace, "commit", "-q", "-m", "first")
    return roots


def committed(roots: Roots, result: dict[str, Any], rel: str) -> bytes:
    alt = {
        "GIT_OBJECT_DIRECTORY": str(roots.output / "c1" / result["objects"]),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(roots.workspace / ".git" / "objects"),
    }
    return git(roots.workspace, "show", f"{result['commit']}:{rel}", **alt).encode()


def person_index(roots: Roots, result: dict[str, Any], rel: str) -> bytes:
    """The content the person's index (as the kernel will swap it in) holds for ``rel``."""
    env = {
        "GIT_OBJECT_DIRECTORY": str(roots.output / "c1" / result["objects"]),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(roots.workspace / ".git" / "objects"),
        "GIT_INDEX_FILE": str(roots.output / "c1" / result["index"]),
    }
    return git(roots.workspace, "show", f":{rel}", **env).encode()


def test_the_commit_takes_the_sessions_change_never_the_persons_lines(lines: Roots) -> None:
    """c.py: the person's uncommitted line was there before the session started (the
    change was made against it); d.py: the person edited it while the session worked (the
    merge wrote both). Either way the commit holds HEAD plus the session's line only, and
    the person's index holds what the commit does (their lines stay unstaged edits)."""
    mine = text(l0="mine 0\n")
    write_tree(lines.workspace, {"c.py": text(l0="mine 0\n", l8="session 8\n"),
                          "d.py": text(l2="mine 2\n", l8="session 8\n")})  # fmt: skip
    order = landed(lines, {"c.py": (mine, text(l0="mine 0\n", l8="session 8\n")),
                           "d.py": (text(), text(l8="session 8\n"))})  # fmt: skip
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert result["files"] == ["c.py", "d.py"] and result["left_out"] == []
    for rel in ("c.py", "d.py"):
        assert committed(lines, result, rel) == text(l8="session 8\n")
        assert person_index(lines, result, rel) == text(l8="session 8\n")


def test_a_change_overlapping_the_persons_lines_is_left_out_with_a_note(lines: Roots) -> None:
    """The session rewrote the line the person had changed and not committed: it cannot
    be told apart, so that file stays out of the commit (both are in the working tree),
    and so does the rest of the change: a commit holds all of it or none."""
    order = landed(lines, {"c.py": (text(l8="mine 8\n"), text(l8="session 8\n")),
                           "d.py": (text(), text(l1="session 1\n"))})  # fmt: skip
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert result["commit"] is None and result["left_out"] == ["c.py", "d.py"]
    assert "c.py was left out of the commit" in result["notes"][0]
    assert "`git diff c.py`" in result["notes"][0]
    assert "d.py was not committed either" in result["notes"][1]
    (lines.staged / "landed.json").unlink()  # a session whose only change overlaps
    alone = landed(lines, {"e.py": (text(l8="mine 8\n"), text(l8="session 8\n"))})
    nothing = ok(call(lines, "git.commit", {"message": "m"}, "c2", settings=alone))
    assert nothing["commit"] is None and nothing["left_out"] == ["e.py"]


def test_changes_merged_twice_before_a_commit_are_carried_in_order(lines: Roots) -> None:
    """Two merges, then one commit: the second change was made against the first merge's
    result plus a line the person wrote meanwhile; the commit has both session lines and
    none of the person's."""
    first = (text(l0="mine 0\n"), text(l0="mine 0\n", l5="session 5\n"))
    second = (text(l0="mine 0\n", l3="mine 3\n", l5="session 5\n"),
              text(l0="mine 0\n", l3="mine 3\n", l5="session 5\n", l9="session 9\n"))  # fmt: skip
    order = landed(lines, {"c.py": [first, second]})
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert committed(lines, result, "c.py") == text(l5="session 5\n", l9="session 9\n")


def test_the_persons_staged_version_is_carried_onto_the_commit_or_kept(lines: Roots) -> None:
    """The person had staged their own line (git add): their index gets the commit's
    change on top of it; where the two overlap their staged version is kept, with a note."""
    write_tree(lines.workspace, {"c.py": text(l0="mine 0\n"), "d.py": text(l8="mine 8\n")})
    git(lines.workspace, "add", "c.py", "d.py")
    order = landed(lines, {"c.py": (text(l0="mine 0\n"), text(l0="mine 0\n", l8="session 8\n"))})
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert committed(lines, result, "c.py") == text(l8="session 8\n")
    assert person_index(lines, result, "c.py") == text(l0="mine 0\n", l8="session 8\n")
    assert person_index(lines, result, "d.py") == text(l8="mine 8\n")  # not the session's
    (lines.staged / "landed.json").unlink()
    order = landed(lines, {"d.py": (text(l8="mine 8\n"), text(l8="session 8\n"))})
    result = ok(call(lines, "git.commit", {"message": "m"}, "c2", settings=order))
    assert result["commit"] is None and result["left_out"] == ["d.py"]  # overlaps


def test_a_staged_version_overlapping_the_commit_is_kept_in_the_index(lines: Roots) -> None:
    write_tree(lines.workspace, {"c.py": text(l8="staged 8\n")})
    git(lines.workspace, "add", "c.py")
    write_tree(lines.workspace, {"c.py": text(l8="session 8\n")})  # the person went back, unstaged
    order = landed(lines, {"c.py": (text(), text(l8="session 8\n"))})
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert committed(lines, result, "c.py") == text(l8="session 8\n")
    assert person_index(lines, result, "c.py") == text(l8="staged 8\n")
    assert any("your staged version of c.py was kept" in note for note in result["notes"])


def test_a_lost_base_copy_commits_only_onto_the_same_content(lines: Roots) -> None:
    order = landed(lines, {"c.py": (text(), text(l8="session 8\n"))})
    (lines.staged / "blobs" / hashlib.sha256(text()).hexdigest()).unlink()
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert committed(lines, result, "c.py") == text(l8="session 8\n")  # HEAD is the base
    (lines.staged / "landed.json").unlink()
    mine = text(l0="mine 0\n")
    order = landed(lines, {"d.py": (mine, text(l0="mine 0\n", l8="s\n"))})
    (lines.staged / "blobs" / hashlib.sha256(mine).hexdigest()).unlink()
    result = ok(call(lines, "git.commit", {"message": "m"}, "c2", settings=order))
    assert result["left_out"] == ["d.py"] and "is lost" in result["notes"][0]


def test_a_removal_is_committed_and_a_new_file_needs_head_without_it(lines: Roots) -> None:
    order = landed(lines, {"c.py": (text(l0="mine 0\n"), None), "new.py": (None, b"new\n")})
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert sorted(result["files"]) == ["c.py", "new.py"] and result["left_out"] == []
    (lines.staged / "landed.json").unlink()
    order = landed(lines, {"d.py": (None, b"session's d\n")})  # HEAD has a d.py already
    result = ok(call(lines, "git.commit", {"message": "m"}, "c2", settings=order))
    assert result["commit"] is None and result["left_out"] == ["d.py"]


def test_a_name_like_pathspec_magic_is_a_plain_file_name(lines: Roots) -> None:
    """`:foo` and `:!x` are file names a model may write, never git's pathspec magic: the
    person's own staged `:foo` is seen (and kept), `:!x` does not break the commit."""
    write_tree(lines.workspace, {":foo": "person staged\n"})
    git(lines.workspace, "add", "--", ":(literal):foo")
    order = landed(lines, {":foo": (None, b"session\n"), ":!x": (None, b"new\n")})
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert sorted(result["files"]) == [":!x", ":foo"]
    assert committed(lines, result, ":foo") == b"session\n"
    assert person_index(lines, result, ":foo") == b"person staged\n"  # theirs, kept
    assert any("your staged version of :foo was kept" in n for n in result["notes"])


def test_end_of_line_attributes_do_not_look_like_the_persons_lines(lines: Roots) -> None:
    """A file git stores with LF and checks out with CRLF: the change is carried in the
    repository's form, so it is committed (not left out as an overlap) and stays LF."""
    write_tree(lines.workspace, {".gitattributes": "*.bat text eol=crlf\n", "run.bat": "a\nb\n"})
    git(lines.workspace, "add", "-A")
    git(lines.workspace, "commit", "-q", "-m", "bat")
    order = landed(lines, {"run.bat": (b"a\r\nb\r\n", b"a\r\nb\r\nc\r\n")})
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert result["left_out"] == [] and result["files"] == ["run.bat"]
    assert committed(lines, result, "run.bat") == b"a\nb\nc\n"


def test_a_binary_file_with_the_persons_changes_is_never_merged(lines: Roots) -> None:
    head = b"\0" + b"".join(f"{i}\n".encode() for i in range(10))
    write_tree(lines.workspace, {"img.bin": head})
    git(lines.workspace, "add", "-A")
    git(lines.workspace, "commit", "-q", "-m", "bin")
    mine = head.replace(b"1\n", b"mine\n")
    order = landed(lines, {"img.bin": (mine, mine.replace(b"8\n", b"session\n"))})
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert result["left_out"] == ["img.bin"] and "binary file" in result["notes"][0]


def test_head_without_a_plain_file_there_is_said_plainly(lines: Roots) -> None:
    (lines.workspace / "link.py").symlink_to("c.py")
    git(lines.workspace, "add", "-A")
    git(lines.workspace, "commit", "-q", "-m", "link")
    order = landed(lines, {"link.py": (None, b"x = 1\n")})
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert result["left_out"] == ["link.py"]
    assert "HEAD has a symbolic link there, not a file" in result["notes"][0]


def test_a_commit_never_holds_part_of_the_change(lines: Roots) -> None:
    """A test without its code would leave HEAD red: when the code is left out (it touches
    the person's uncommitted lines), the test is not committed either; both stay in the
    working tree and the notes say so."""
    order = landed(lines, {"c.py": (text(l8="mine 8\n"), text(l8="session 8\n")),
                           "tests/test_c.py": (None, b"from c import x\n")})  # fmt: skip
    result = ok(call(lines, "git.commit", {"message": "m"}, settings=order))
    assert result["commit"] is None and result["files"] == []
    assert result["left_out"] == ["c.py", "tests/test_c.py"]
    assert "a commit holds the session's whole change or none of it" in result["notes"][1]
