"""What ``git.commit`` takes of each merged path: the session's changes carried onto HEAD.

The kernel hands the tool, for each path the session merged since its last commit, the
changes as ``[base sha256, new sha256]`` pairs (kernel/merge/landed.py) and their
contents under ``/staged/blobs/<sha256>``.  Each change is carried onto HEAD's file with
:func:`fluffy.merge3.carry`, so the person's uncommitted lines in that file -- made
before the session or while it worked -- stay in the working tree and out of the
commit.  Where a change cannot be told apart from them (they overlap), the path is left
out of the commit with a note: the working tree has both, for the person to commit.

The person's index is updated for a committed path only where it held HEAD's version;
a version they staged themselves is kept (carried onto the new commit when the two do
not overlap), never replaced.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fluffy.errors import ToolFailed, ToolInputInvalid
from fluffy.merge3 import carry, merge3
from fluffy.plugins.git_tool.gitcmd import git
from fluffy.plugins.sdk import ToolContext, normalise_path

REGULAR = ("100644", "100755")
MAX_STEPS = 10000


@dataclass(frozen=True)
class Entry:
    """A path in HEAD's tree or an index: its mode and git object id."""

    mode: str
    sha1: str


@dataclass
class Landing:
    """What the commit takes: path -> content (None: removed), and what it leaves out."""

    contents: dict[str, bytes | None] = field(default_factory=dict)
    heads: dict[str, Entry | None] = field(default_factory=dict)  # HEAD's entry of each
    left_out: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _steps(raw: Any, rel: str) -> list[tuple[str | None, str | None]]:
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_STEPS:
        raise ToolInputInvalid(f"the kernel's changes of {rel} are not a list of steps")
    steps: list[tuple[str | None, str | None]] = []
    for step in raw:
        if not isinstance(step, list | tuple) or len(step) != 2:
            raise ToolInputInvalid(f"a change of {rel} is not a [base, new] pair")
        for sha in step:
            if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
                raise ToolInputInvalid(f"a change of {rel} names {sha!r}, not a sha256")
        steps.append((step[0], step[1]))
    return steps


class Blobs:
    """The landed record's contents (``/staged/blobs``) and HEAD's files."""

    def __init__(self, ctx: ToolContext, env: dict[str, str]) -> None:
        self.ctx, self.env = ctx, env
        self.folder = ctx.view.staged / "blobs"
        self.known: dict[str, bytes] = {}  # git sha1 -> content, of every blob read

    def landed(self, sha: str | None, rel: str, *, needed: bool) -> bytes | None:
        """The record's content ``sha`` (None: absent; or lost, unless ``needed``)."""
        if sha is None:
            return None
        source = self.folder / sha
        data = source.read_bytes() if source.is_file() and not source.is_symlink() else None
        if data is not None and hashlib.sha256(data).hexdigest() == sha:
            self.known[git_sha1(data)] = data
            return data
        if needed:
            raise ToolFailed(
                f"the merged content of {rel} is not the one the merge recorded",
                why="the session's record of what it merged was changed or lost",
                fix="Make the change again; the merged files are in the project.",
            )
        return None

    def entry(
        self, tree: str | None, rel: str, index: dict[str, str] | None = None
    ) -> Entry | None:
        """``rel`` in ``tree``, or with ``index`` in that index (an unmerged path's mode
        is ``"unmerged"``)."""
        if index is not None:
            out = git(self.ctx, "ls-files", "-s", "-z", "--", rel, env={**self.env, **index})
        elif tree is None:
            return None
        else:
            out = git(self.ctx, "ls-tree", "-z", tree, "--", rel, env=self.env)
        for record in out.stdout.split("\0"):
            head, _, name = record.partition("\t")
            parts = head.split()
            if name != rel or len(parts) != 3:
                continue
            if index is None:  # <mode> <type> <object>
                return Entry(parts[0], parts[2])
            # <mode> <object> <stage>
            return Entry(parts[0] if parts[2] == "0" else "unmerged", parts[1])
        return None

    def read(self, entry: Entry) -> bytes:
        """A blob of the repository, as bytes (never through a text pipe)."""
        if entry.sha1 in self.known:
            return self.known[entry.sha1]
        made = git(self.ctx, "unpack-file", entry.sha1, env=self.env, cwd=self.ctx.call_dir,
                   check=False)  # fmt: skip
        name = made.stdout.strip()
        if not made.ok or not name or "/" in name:
            raise ToolFailed(
                f"cannot read git object {entry.sha1}: {made.stderr.strip()[-500:]}",
                why="git could not unpack a file of HEAD's tree",
                fix="Check the repository with `git fsck` on the host.",
            )
        path = self.ctx.call_dir / name
        data = path.read_bytes()
        path.unlink()
        self.known[entry.sha1] = data
        return data


def carry_all(ctx: ToolContext, order: dict[str, Any], parent: str | None,
              env: dict[str, str]) -> Landing:  # fmt: skip
    """Each merged path's content for the commit, carried onto HEAD's."""
    blobs, landing = Blobs(ctx, env), Landing()
    for raw, steps in sorted(order["paths"].items()):
        rel = normalise_path(raw, what="a landed path")
        head = blobs.entry(parent, rel)
        landing.heads[rel] = head
        if head is not None and head.mode not in REGULAR:
            _leave(landing, rel, f"HEAD has no plain file at {rel} (mode {head.mode})")
            continue
        content = None if head is None else blobs.read(head)
        for base_sha, new_sha in _steps(steps, rel):
            new = blobs.landed(new_sha, rel, needed=True)
            base = blobs.landed(base_sha, rel, needed=False)
            if base_sha is not None and base is None:  # a lost copy: only onto itself
                if content is None or hashlib.sha256(content).hexdigest() != base_sha:
                    _leave(landing, rel, _LOST.format(rel=rel))
                    break
                base = content
            done, content = carry(content, base, new)
            if not done:
                _leave(landing, rel, _OVERLAP.format(rel=rel))
                break
        else:
            landing.contents[rel] = content
    return landing


_OVERLAP = (
    "{rel} was left out of the commit: the session's change there overlaps lines of yours "
    "that are not committed. Both are in your working tree; `git diff {rel}` shows them "
    "and you commit them yourself"
)

_LOST = (
    "{rel} was left out of the commit: the copy the session's change was made against "
    "is lost, so it cannot be told apart from your uncommitted lines there. The change is "
    "in your working tree; `git diff {rel}` shows it and you commit it yourself"
)


def _leave(landing: Landing, rel: str, note: str) -> None:
    landing.left_out.append(rel)
    landing.notes.append(note)


def person_entry(blobs: Blobs, landing: Landing, rel: str, new: Entry | None,
                 index: dict[str, str]) -> Entry | str | None:  # fmt: skip
    """The person's index entry for a committed path: the commit's where they held HEAD's
    version; their own staged version carried onto it; else ``"keep"``."""
    theirs = blobs.entry(None, rel, index)
    head = landing.heads.get(rel)
    if theirs in (head, new):
        return new
    if theirs is None or new is None or head is None or theirs.mode not in REGULAR:
        return "keep"
    merged = merge3(blobs.read(head), blobs.read(theirs), blobs.read(new))
    if merged is None:
        return "keep"
    path = blobs.ctx.call_dir / "person-blob"
    path.write_bytes(merged)
    sha = git(blobs.ctx, "hash-object", "-w", f"--path={rel}", str(path), env=blobs.env)
    return Entry(theirs.mode, sha.stdout.strip())


def kept_note(rel: str) -> str:
    return (
        f"your staged version of {rel} was kept in git's index as it was (it overlaps the "
        f"commit's change): `git diff --cached {rel}` shows it against the new commit"
    )


def write_blob(ctx: ToolContext, rel: str, data: bytes, env: dict[str, str]) -> str:
    """Store ``data`` as a blob in the call's object folder; its id."""
    path = Path(ctx.call_dir) / "landed-blob"
    path.write_bytes(data)
    return git(ctx, "hash-object", "-w", f"--path={rel}", str(path), env=env).stdout.strip()
