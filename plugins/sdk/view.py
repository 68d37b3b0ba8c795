"""The project as a tool sees it: ``/workspace`` overlaid with the session's staged changes.

``/staged/tree/<path>`` holds the full new content of each staged file and
``/staged/deleted.txt`` lists staged deletions (one path a line); either may be missing.
The view is (workspace + staged tree) minus the deleted paths.  Nothing is ever followed
out of a root: a path whose real location (after symbolic links) leaves ``/workspace``
or ``/staged/tree`` is refused, and :meth:`ProjectView.walk` never descends a link.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

from fluffy.errors import ToolInputInvalid
from fluffy.pathnames import is_utf8, matchable
from fluffy.plugins.sdk.paths import normalise_path


class Entry(NamedTuple):
    """One file (or symbolic link) of the view."""

    path: str  # relative to the project root, "/"-separated
    source: Path  # where it is: under the workspace or the staged tree
    link: str | None = None  # a symbolic link's target as written; None for a regular file


def _read_deleted(path: Path) -> frozenset[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return frozenset()
    deleted: set[str] = set()
    for line in text.splitlines():
        try:
            deleted.add(normalise_path(line.rstrip("\r")))
        except ValueError:
            continue  # blank lines; the kernel never stages anything else
    return frozenset(deleted)


class ProjectView:
    """Read-only access to the view; every ``rel`` is a normalised path (see paths.py)."""

    def __init__(self, workspace: Path, staged: Path) -> None:
        self.workspace = Path(workspace)
        self.staged = Path(staged)
        self.tree = self.staged / "tree"
        self.deleted = _read_deleted(Path(staged) / "deleted.txt")
        self._real = {root: os.path.realpath(root) for root in (self.workspace, self.tree)}

    def _contained(self, root: Path, candidate: Path) -> bool:
        real_root = self._real[root]
        real = os.path.realpath(candidate)
        return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)

    def _at(self, root: Path, rel: str) -> Path:
        return root if rel == "." else root / rel

    def locate(self, rel: str) -> Path | None:
        """Where ``rel`` is (staged tree first), None if absent; ValueError for a link out."""
        if rel in self.deleted:
            return None
        for root in (self.tree, self.workspace):
            candidate = self._at(root, rel)
            if os.path.lexists(candidate):
                if not self._contained(root, candidate):
                    raise ValueError(
                        f"{rel!r} is a link that leads outside the project. Fix: use the "
                        "path of the file it points to, if that is inside the project."
                    )
                return candidate
        return None

    def is_file(self, rel: str) -> bool:
        try:
            found = self.locate(rel)
        except ValueError:
            return False
        return found is not None and found.is_file()

    def is_dir(self, rel: str) -> bool:
        if rel == ".":
            return True
        try:
            return any(d.is_dir() for d in self._dirs(rel))
        except ValueError:
            return False

    def _dirs(self, rel: str) -> list[Path]:
        if rel in self.deleted:
            return []
        found = []
        for root in (self.tree, self.workspace):
            candidate = self._at(root, rel)
            if os.path.lexists(candidate) and self._contained(root, candidate):
                if candidate.is_dir():
                    found.append(candidate)
            elif os.path.lexists(candidate):
                raise ValueError(f"{rel!r} is a link that leads outside the project")
        return found

    def read_bytes(self, rel: str) -> bytes:
        found = self.locate(rel)
        if found is None or not found.exists():
            raise ToolInputInvalid(
                f"{rel} does not exist in the project",
                why="neither the project nor the session's staged changes have that file",
                fix="Check the path; search.glob lists the project's files.",
            )
        if found.is_dir():
            raise ToolInputInvalid(
                f"{rel} is a folder, not a file", fix="Name a file inside it instead."
            )
        return found.read_bytes()

    def list_dir(self, rel: str) -> list[str]:
        """Names in folder ``rel`` (files and folders, no ``.git``), sorted; a name that
        is not UTF-8 is left out (no answer can carry it: :mod:`fluffy.pathnames`)."""
        folders = (
            self._dirs(rel)
            if rel != "."
            else [root for root in (self.tree, self.workspace) if root.is_dir()]
        )
        if not folders:
            raise ToolInputInvalid(
                f"{rel} is not a folder of the project", fix="Check the path (list_dir('.'))."
            )
        names: set[str] = set()
        for folder in folders:
            with os.scandir(folder) as entries:
                for entry in entries:
                    child = entry.name if rel == "." else f"{rel}/{entry.name}"
                    if entry.name.lower() == ".git" or child in self.deleted:
                        continue
                    if not is_utf8(entry.name):
                        continue
                    names.add(entry.name)
        return sorted(names)

    def walk(self, rel: str = ".", skip: frozenset[str] = frozenset()) -> list[Entry]:
        """Every file and symbolic link of the view under ``rel``, sorted by path.

        Folders named in ``skip`` (and ``.git``, always) are not entered; links are
        reported (with their target), never followed.  Sockets, FIFOs and devices are left
        out.  ``rel`` may also name a single file.
        """
        found: dict[str, Entry] = {}
        for root in (self.workspace, self.tree):  # the staged tree overrides
            start = self._at(root, rel)
            if not os.path.lexists(start) or not self._contained(root, start):
                continue
            if start.is_symlink() or not start.is_dir():
                entry = _entry(rel, start)
                if entry is not None and rel != ".":
                    found[rel] = entry
                continue
            for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
                here = Path(dirpath).relative_to(root).as_posix()
                prefix = "" if here == "." else here + "/"
                kept = []
                for name in sorted(dirnames):
                    full = Path(dirpath, name)
                    if name.lower() == ".git" or name in skip or not is_utf8(name):
                        continue
                    if full.is_symlink():
                        found[prefix + name] = Entry(prefix + name, full, _target(full))
                    else:
                        kept.append(name)
                dirnames[:] = kept
                for name in filenames:
                    if not is_utf8(name):  # a name no tool's answer can carry (fluffy.pathnames)
                        continue
                    entry = _entry(prefix + name, Path(dirpath, name))
                    if entry is not None:
                        found[entry.path] = entry
        return [found[path] for path in sorted(found) if path not in self.deleted]


def _entry(rel: str, full: Path) -> Entry | None:
    try:
        mode = os.lstat(full).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return Entry(rel, full, _target(full))
    if stat.S_ISREG(mode):
        return Entry(rel, full)
    return None


def _target(link: Path) -> str:
    """A link's target as text (its undecodable bytes as U+FFFD: it is never followed)."""
    return matchable(str(link.readlink()))
