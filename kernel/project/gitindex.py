"""Which of a project's paths git tracks: the entries of its ``.git/index``.

Read to tell the person's own files from the repository's: a ``.env`` kept beside the
code and never committed is theirs, a test certificate the repository ships is not
(:mod:`fluffy.kernel.project.testsecrets`).  The index is read without git: versions
2, 3 and 4 (whose paths are prefix-compressed), SHA-1 or SHA-256 object names; a sparse
index's directory entries stand for everything under them.  An index whose entries are
elsewhere (a split index, a worktree's ``.git`` file) or that does not parse is unknown:
None.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from fluffy.errors import FluffyError
from fluffy.kernel.confined_files import read_existing

MAX_INDEX_BYTES = 64 * 1024 * 1024
_DIR_MODE = 0o040000
_EXTENDED = 0x4000


class Tracked(msgspec.Struct, frozen=True):
    """The paths an index names (files, and a sparse index's folders as ``dir/``)."""

    files: frozenset[str]
    folders: tuple[str, ...] = ()

    def __contains__(self, rel: object) -> bool:
        return rel in self.files or (
            isinstance(rel, str) and any(rel.startswith(folder) for folder in self.folders)
        )


NOTHING = Tracked(frozenset())


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
    files: set[str] = set()
    folders: list[str] = []
    for _ in range(count):
        if pos + fixed > end:
            return None
        mode = int.from_bytes(data[pos + 24 : pos + 28], "big")
        flags = int.from_bytes(data[pos + fixed - 2 : pos + fixed], "big")
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
            files.add(name)
    while pos + 8 <= end:  # extensions: a split index keeps its entries elsewhere
        if data[pos : pos + 4] == b"link":
            return None
        pos += 8 + int.from_bytes(data[pos + 4 : pos + 8], "big")
    return Tracked(frozenset(files), tuple(folders))


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
