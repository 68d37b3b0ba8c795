"""What ``git.commit`` takes of each merged path: the session's changes carried onto HEAD.

The kernel hands the tool, for each path the session merged since its last commit, the
changes as ``[base sha256, new sha256]`` pairs (kernel/merge/landed.py) and their
contents under ``/staged/blobs/<sha256>``.  Each change is brought to the repository's
form of the file (its clean filter and end-of-line settings, as `git add` would) and
carried onto HEAD's file with :func:`fluffy.merge3.carry`, so the person's uncommitted
lines in that file -- made before the session or while it worked -- stay in the working
tree and out of the commit.  A path is left out of the commit, with a note, where the
change cannot be told apart from their lines (they overlap, the file is binary or too
large to separate, HEAD has no plain file there) or its record is damaged: the working
tree has the change, for the person to commit; and then the other paths are left out
too: a commit holds the session's whole change or none of it.

The person's index is updated for a committed path only where it held HEAD's version;
a version they staged is carried onto the commit's, or kept as it was, never replaced.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from fluffy.errors import ToolFailed
from fluffy.merge3 import carry, is_binary, merge3
from fluffy.plugins.git_tool.gitcmd import git
from fluffy.plugins.sdk import ToolContext, normalise_path

REGULAR = ("100644", "100755")
MAX_STEPS = 10000
#: Larger files are not separated line by line (the merge's time grows with the square).
MAX_CARRY_BYTES = 2 * 1024 * 1024
HEX = frozenset("0123456789abcdef")
KEEP: Final = "keep"
Steps = list[tuple[str | None, str | None]]


@dataclass(frozen=True)
class Entry:
    """A path in HEAD's tree or an index: its mode and git object id."""

    mode: str
    sha1: str


@dataclass
class Landing:
    """What the commit takes: path -> content in the repository's form (None: removed),
    and what it leaves out and why."""

    contents: dict[str, bytes | None] = field(default_factory=dict)
    heads: dict[str, Entry | None] = field(default_factory=dict)  # HEAD's entry of each
    left_out: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def leave(self, rel: str, why: str) -> None:
        self.left_out.append(rel)
        self.notes.append(
            f"{rel} was left out of the commit: {why}. The session's change is in your "
            f"working tree; `git diff {rel}` shows it, and you commit it yourself"
        )


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _sha(value: object) -> bool:
    return value is None or (isinstance(value, str) and len(value) == 64 and set(value) <= HEX)


def _steps(raw: Any) -> Steps | None:
    """The recorded changes of a path; None when the record is damaged."""
    if not isinstance(raw, list | tuple) or not 0 < len(raw) <= MAX_STEPS:
        return None
    steps: Steps = []
    for step in raw:
        if not isinstance(step, list | tuple) or len(step) != 2 or not all(map(_sha, step)):
            return None
        steps.append((step[0], step[1]))
    return steps


class Blobs:
    """The landed record's contents (``/staged/blobs``), HEAD's files, new blobs."""

    def __init__(self, ctx: ToolContext, env: dict[str, str]) -> None:
        self.ctx, self.env = ctx, env
        self.folder = ctx.view.staged / "blobs"
        self.known: dict[str, bytes] = {}  # git id -> content, of every blob seen

    def landed(self, sha: str) -> bytes | None:
        """The record's content ``sha`` (None: missing, or not that content)."""
        source = self.folder / sha
        data = source.read_bytes() if source.is_file() and not source.is_symlink() else None
        if data is None or hashlib.sha256(data).hexdigest() != sha:
            return None
        self.known[git_sha1(data)] = data  # HEAD's file is often this very content
        return data

    def entries(
        self, tree: str | None, rels: list[str], index: dict[str, str] | None = None
    ) -> dict[str, Entry]:
        """``rels`` in ``tree``, or with ``index`` in that index, in one git call (an
        unmerged path's mode is ``"unmerged"``; a path that is not there is missing)."""
        if not rels or (tree is None and index is None):
            return {}
        if index is not None:
            command = ["ls-files", "-s", "-z", "--", *rels]
        else:
            command = ["ls-tree", "-z", str(tree), "--", *rels]
        out = git(self.ctx, *command, env={**self.env, **(index or {})}).stdout
        wanted, found = set(rels), {}
        for record in out.split("\0"):
            head, _, name = record.partition("\t")
            parts = head.split()
            if name not in wanted or len(parts) != 3:
                continue
            if index is None:  # <mode> <type> <object>
                found[name] = Entry(parts[0], parts[2])
            else:  # <mode> <object> <stage>
                found[name] = Entry(parts[0] if parts[2] == "0" else "unmerged", parts[1])
        return found

    def read(self, sha1: str) -> bytes:
        """A blob of the repository, as bytes (never through a text pipe)."""
        if sha1 in self.known:
            return self.known[sha1]
        made = git(self.ctx, "unpack-file", sha1, env=self.env, cwd=self.ctx.call_dir,
                   check=False)  # fmt: skip
        name = made.stdout.strip()
        if not made.ok or not name or "/" in name:
            raise ToolFailed(
                f"cannot read git object {sha1}: {made.stderr.strip()[-500:]}",
                why="git could not unpack a file of HEAD's tree or the index",
                fix="Check the repository with `git fsck` on the host.",
            )
        path = self.ctx.call_dir / name
        data = path.read_bytes()
        path.unlink()
        self.known[sha1] = data
        return data

    def _hash(self, data: bytes, *how: str) -> str:
        path = self.ctx.call_dir / "landed-blob"
        path.write_bytes(data)
        return git(self.ctx, "hash-object", *how, str(path), env=self.env).stdout.strip()

    def store(self, data: bytes) -> str:
        """``data``, already in the repository's form, as a blob of the call's objects."""
        return self.store_all([data])[0]

    def store_all(self, contents: list[bytes]) -> list[str]:
        """Each of ``contents`` (in the repository's form) as a blob, in one git call."""
        if not contents:
            return []
        paths = []
        for number, data in enumerate(contents):
            paths.append(self.ctx.call_dir / f"landed-blob-{number}")
            paths[-1].write_bytes(data)
        listed = "".join(f"{path}\n" for path in paths)
        out = git(self.ctx, "hash-object", "-w", "--no-filters", "--stdin-paths", env=self.env,
                  input=listed).stdout.split()  # fmt: skip
        for path in paths:
            path.unlink()
        self.known.update(zip(out, contents, strict=True))
        return out

    def converting(self, rels: list[str]) -> set[str]:
        """Which of ``rels`` git stores other than as their bytes (an end-of-line, text,
        filter, encoding or ident attribute, or core.autocrlf), in one git call."""
        value = git(self.ctx, "config", "--get", "core.autocrlf", env=self.env, check=False)
        if value.stdout.strip().lower() in ("true", "input"):
            return set(rels)
        attrs = ("text", "eol", "crlf", "filter", "working-tree-encoding", "ident")
        out = git(self.ctx, "check-attr", "-z", *attrs, "--", *rels, env=self.env).stdout
        fields = out.split("\0")  # <path> NUL <attribute> NUL <value> NUL ...
        return {
            fields[i]
            for i in range(0, len(fields) - 2, 3)
            if fields[i + 2] not in ("unspecified", "unset")
        }

    def repo_form(self, rel: str, data: bytes) -> bytes:
        """``data`` (a working-tree file of ``rel``) as the repository stores it."""
        sha = self._hash(data, "-w", f"--path={rel}")
        return data if sha == git_sha1(data) else self.read(sha)


def carry_all(blobs: Blobs, order: dict[str, Any], parent: str | None) -> Landing:
    """Each merged path's content for the commit, carried onto HEAD's."""
    landing = Landing()
    recorded = {normalise_path(raw, what="a landed path"): steps
                for raw, steps in order["paths"].items()}  # fmt: skip
    rels = sorted(recorded)
    heads, converting = blobs.entries(parent, rels), blobs.converting(rels)
    for rel in rels:
        head = landing.heads[rel] = heads.get(rel)
        steps = _steps(recorded[rel])
        if head is not None and head.mode not in REGULAR:
            kind = {"120000": "a symbolic link", "160000": "a submodule"}.get(head.mode, "a folder")
            landing.leave(rel, f"HEAD has {kind} there, not a file")
        elif steps is None:
            landing.leave(rel, "the kernel's record of the change is damaged")
        else:
            try:
                landing.contents[rel] = _carried(blobs, rel, head, steps, rel in converting)
            except LeftOut as exc:
                landing.leave(rel, str(exc))
    if landing.left_out and landing.contents:  # never a commit of part of the change
        rest = sorted(landing.contents)
        landing.left_out += rest
        landing.contents.clear()
        landing.notes.append(
            f"{', '.join(rest)} {'was' if len(rest) == 1 else 'were'} not committed either: "
            "a commit holds the session's whole change or none of it (a test without its "
            "code would leave HEAD red). Everything is in your working tree; commit it "
            "together once you have looked at the file(s) above"
        )
    return landing


class LeftOut(Exception):
    """Why a path's change cannot be carried onto HEAD's file."""


def _carried(
    blobs: Blobs, rel: str, head: Entry | None, steps: Steps, converts: bool
) -> bytes | None:
    """``steps`` carried onto HEAD's ``rel`` (:class:`LeftOut` when they cannot be)."""
    first_base = steps[0][0]
    if first_base is not None:
        blobs.landed(first_base)  # known: HEAD's file is read without git when it is this
    content = None if head is None else blobs.read(head.sha1)
    for base_sha, new_sha in steps:
        new = None if new_sha is None else blobs.landed(new_sha)
        if new_sha is not None and new is None:
            raise LeftOut("the kernel's record of the change is damaged (its content is missing)")
        base = None if base_sha is None else blobs.landed(base_sha)
        if base_sha is not None and base is None:  # a lost copy: only onto itself
            if content is None or hashlib.sha256(content).hexdigest() != base_sha:
                raise LeftOut(
                    "the copy the change was made against is lost, so it cannot be told "
                    "apart from your uncommitted lines there"
                )
            base = content
        if converts:
            new = None if new is None else blobs.repo_form(rel, new)
            base = None if base is None else blobs.repo_form(rel, base)
        sides = [side for side in (content, base, new) if side is not None]
        if new is not None and content not in (base, new):  # a merge with their lines
            if any(map(is_binary, sides)):
                raise LeftOut("it is a binary file with changes of yours that are not committed")
            if max(map(len, sides)) > MAX_CARRY_BYTES:
                raise LeftOut(
                    f"it is larger than {MAX_CARRY_BYTES // 1024 // 1024} MiB and holds "
                    "changes of yours that are not committed"
                )
        done, content = carry(content, base, new)
        if not done:
            raise LeftOut("the change touches lines of yours that are not committed")
    return content


def person_entry(blobs: Blobs, landing: Landing, rel: str, new: Entry | None,
                 theirs: Entry | None) -> Entry | Literal["keep"] | None:  # fmt: skip
    """The person's index entry for a committed path (``theirs``: what it holds now):
    the commit's where they held HEAD's version; their own staged version carried onto
    it; else :data:`KEEP`."""
    head = landing.heads.get(rel)
    if theirs in (head, new):
        return new
    if theirs is None or new is None or head is None or theirs.mode not in REGULAR:
        return KEEP
    sides = [blobs.read(head.sha1), blobs.read(theirs.sha1), blobs.read(new.sha1)]
    if any(map(is_binary, sides)) or max(map(len, sides)) > MAX_CARRY_BYTES:
        return KEEP
    merged = merge3(*sides)
    return KEEP if merged is None else Entry(theirs.mode, blobs.store(merged))


def kept_note(rel: str) -> str:
    return (
        f"your staged version of {rel} was kept in git's index as it was (it could not be "
        f"combined with the commit's change): `git diff --cached {rel}` shows it against "
        "the new commit"
    )
