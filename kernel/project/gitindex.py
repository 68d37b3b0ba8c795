"""Which of a project's paths git tracks: the entries of its ``.git/index``.

Read to tell the person's own files from the repository's: a ``.env`` kept beside the
code and never committed is theirs, a test certificate the repository ships is not
(:mod:`fluffy.kernel.project.testsecrets`), and neither is a committed placeholder the
person has since filled in (:meth:`Tracked.holds` compares the content with git's object
name).  The index is read without git: versions 2, 3 and 4 (whose paths are
prefix-compressed), SHA-1 or SHA-256 object names; a sparse index's directory entries
stand for everything under them.  An index whose entries are elsewhere (a split index, a
worktree's ``.git`` file) or that does not parse is unknown: None.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import msgspec

from fluffy.errors import FluffyError
from fluffy.kernel.confined_files import read_existing

MAX_INDEX_BYTES = 64 * 1024 * 1024
#: Files larger than this are never compared with their object (:meth:`Tracked.holds`).
MAX_COMPARED_BYTES = 16 * 1024 * 1024
_DIR_MODE = 0o040000
_LINK_MODE = 0o120000
_EXTENDED = 0x4000
_ASSUME_VALID = 0x8000  # flags: git does not look at the file (assume-unchanged)
_SKIP_WORKTREE = 0x4000  # extended flags: the file is not git's to look at


class IndexEntry(NamedTuple):
    oid: bytes  # the object name of the content git holds
    mode: int
    aside: bool  # assume-unchanged or skip-worktree: the file on disk is not git's


class Tracked(msgspec.Struct, frozen=True):
    """The paths an index names (files, and a sparse index's folders as ``dir/``)."""

    entries: Mapping[str, IndexEntry]
    folders: tuple[str, ...] = ()

    @property
    def files(self) -> frozenset[str]:
        return frozenset(self.entries)

    def __contains__(self, rel: object) -> bool:
        return rel in self.entries or (
            isinstance(rel, str) and any(rel.startswith(folder) for folder in self.folders)
        )

    def holds(self, project: Path, rel: str) -> bool:
        """Whether the index lists ``rel`` with the content it has in ``project`` (git's
        object name for it), and git looks at that file (not assume-unchanged nor
        skip-worktree).  A file under a sparse folder has no entry of its own: False."""
        entry = self.entries.get(rel)
        if entry is None or entry.aside:
            return False
        path = project / rel
        try:
            if entry.mode & 0o170000 == _LINK_MODE:
                data = os.fsencode(path.readlink())
            else:
                found = read_existing(project, rel, MAX_COMPARED_BYTES)
                if found is None:
                    return False
                data = found
        except (OSError, FluffyError):
            return False
        digest = hashlib.sha1 if len(entry.oid) == 20 else hashlib.sha256
        return digest(b"blob %d\0" % len(data) + data).digest() == entry.oid


NOTHING = Tracked({})


def tracked(project: Path) -> Tracked | None:
    """What git tracks in ``project`` (nothing when it is no repository, or has no index
    yet), or None when that cannot be told."""
    try:
        if (project / ".git").is_file():  # a worktree: its index is elsewhere
            return None
        data = read_existing(project, ".git/index", MAX_INDEX_BYTES)
    except (OSError, FluffyError):
        return None
    if data is None:
        return NOTHING
    return parse_index(data)


def parse_index(data: bytes) -> Tracked | None:
    """The entries of a git index file's bytes, or None (not an index this reads)."""
    for digest in (hashlib.sha1, hashlib.sha256):
        size = digest().digest_size
        if len(data) >= 12 + size and digest(data[:-size]).digest() == data[-size:]:
            return _entries(data, size)
    return None


def _entries(data: bytes, oid: int) -> Tracked | None:
    if data[:4] != b"DIRC":
        return None
    version = int.from_bytes(data[4:8], "big")
    count = int.from_bytes(data[8:12], "big")
    if version not in (2, 3, 4):
        return None
    end, pos, previous = len(data) - oid, 12, b""
    fixed = 40 + oid + 2  # stat fields, object name, flags
    entries: dict[str, IndexEntry] = {}
    folders: list[str] = []
    for _ in range(count):
        if pos + fixed > end:
            return None
        mode = int.from_bytes(data[pos + 24 : pos + 28], "big")
        flags = int.from_bytes(data[pos + fixed - 2 : pos + fixed], "big")
        extended = int.from_bytes(data[pos + fixed : pos + fixed + 2], "big")
        extended = extended if flags & _EXTENDED else 0
        aside = bool(flags & _ASSUME_VALID or extended & _SKIP_WORKTREE)
        name_oid = data[pos + 40 : pos + 40 + oid]
        head = fixed + (2 if flags & _EXTENDED else 0)
        start = pos + head
        if version == 4:
            strip, start = _varint(data, start, end)
            nul = data.find(b"\0", start, end)
            if strip < 0 or strip > len(previous) or nul < 0:
                return None
            path = previous[: len(previous) - strip] + data[start:nul]
            pos = nul + 1
        else:
            nul = data.find(b"\0", start, end)
            if nul < 0:
                return None
            path = data[start:nul]
            pos += (head + len(path) + 8) & ~7  # padded with 1 to 8 NULs
        previous = path
        name = path.decode("utf-8", "surrogateescape")
        if mode & 0o170000 == _DIR_MODE:
            folders.append(name.rstrip("/") + "/")
        else:
            entries[name] = IndexEntry(name_oid, mode, aside)
    while pos + 8 <= end:  # extensions: a split index keeps its entries elsewhere
        if data[pos : pos + 4] == b"link":
            return None
        pos += 8 + int.from_bytes(data[pos + 4 : pos + 8], "big")
    return Tracked(entries, tuple(folders))


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """git's offset varint at ``pos``: (value, position after it); (-1, pos) if cut."""
    value = -1
    while pos < end:
        byte = data[pos]
        pos += 1
        value = (byte & 0x7F) if value < 0 else ((value + 1) << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, pos
    return -1, pos
