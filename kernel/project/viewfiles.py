"""Which of a project's files are *the project* (for tests, evidence and environments).

One rule for everything that walks a project: the test sandbox's view, the tree hashes
of the TDD evidence, and the copy an environment build installs from.  Tool state and
caches (``.git``, ``.fluffy``, virtual environments, ``node_modules``, ``__pycache__``,
test and type-checker caches, ``*.egg-info``) are not the project; symbolic links are
reported as links and never followed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import msgspec

IGNORED_DIRS = frozenset(
    {".git", ".fluffy", "__pycache__", ".venv", "venv", "node_modules", ".pytest_cache"}
    | {".mypy_cache", ".ruff_cache", ".tox", ".nox", ".hypothesis", ".eggs"}
)
IGNORED_DIR_SUFFIXES = (".egg-info",)
IGNORED_FILE_SUFFIXES = (".pyc", ".pyo")


def ignored_dir(name: str) -> bool:
    return name in IGNORED_DIRS or name.endswith(IGNORED_DIR_SUFFIXES)


def ignored_file(name: str) -> bool:
    return name.endswith(IGNORED_FILE_SUFFIXES)


def ignored(rel: str) -> bool:
    """Whether a project path (file) is outside the project by these rules."""
    parts = rel.split("/")
    return any(ignored_dir(p) for p in parts[:-1]) or ignored_file(parts[-1])


class Entry(msgspec.Struct, frozen=True):
    """A file or symbolic link of the project."""

    rel: str
    size: int
    mode: int
    mtime_ns: int
    ino: int
    dev: int
    link: str | None = None  # a symlink's target as written

    @property
    def signature(self) -> tuple[int, int, int, int, int]:
        """What changes when the file's content may have changed."""
        return (self.size, self.mtime_ns, self.ino, self.dev, self.mode)


def walk_project(root: Path) -> Iterator[Entry]:
    """Every regular file and symlink of the project (sorted per folder, depth first);
    an unreadable folder raises OSError."""
    stack = [""]
    while stack:
        folder = stack.pop()
        with os.scandir(root / folder if folder else root) as found:
            entries = sorted(found, key=lambda e: e.name)
        subdirs: list[str] = []
        for entry in entries:
            rel = f"{folder}/{entry.name}" if folder else entry.name
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                if not ignored_dir(entry.name):
                    subdirs.append(rel)
                continue
            if ignored_file(entry.name):
                continue
            if stat.S_ISLNK(info.st_mode):
                try:
                    target = str(Path(entry.path).readlink())
                except OSError:
                    continue
                if ignored_dir(entry.name):
                    continue  # a symlinked .venv and the like
                yield Entry(rel, info.st_size, info.st_mode, info.st_mtime_ns, info.st_ino,
                            info.st_dev, target)  # fmt: skip
            elif stat.S_ISREG(info.st_mode):
                yield Entry(rel, info.st_size, info.st_mode, info.st_mtime_ns, info.st_ino,
                            info.st_dev)  # fmt: skip
        stack.extend(reversed(subdirs))
