"""Reading a file's audit rows for verification, and where the scan stands between files.

Rows are decoded from their stored columns and each hash recomputed from them: stored
hashes are never trusted.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import msgspec

from fluffy.kernel.audit.entry import _BASE, _encode
from fluffy.kernel.audit.store import SELECT_ROWS, unpack


def recompute_hash(body: tuple[Any, ...]) -> str:
    """An entry's hash, recomputed from its decoded fields (the row without its hash)."""
    digest = _BASE.copy()
    digest.update(_encode(body))
    return digest.hexdigest()


def read_rows(conn: sqlite3.Connection, after: int | None = None) -> Iterator[tuple[Any, ...]]:
    if after is None:
        cursor = conn.execute(SELECT_ROWS + " ORDER BY seq")
    else:
        cursor = conn.execute(SELECT_ROWS + " WHERE seq > ? ORDER BY seq", (after,))
    while batch := cursor.fetchmany(4096):
        yield from map(unpack, batch)


def read_row(conn: sqlite3.Connection, seq: int) -> tuple[Any, ...] | None:
    stored = conn.execute(SELECT_ROWS + " WHERE seq = ?", (seq,)).fetchone()
    return None if stored is None else unpack(stored)


class Chain(msgspec.Struct):
    """Where the scan stands between files."""

    prev_hash: str | None = None
    prev_seq: int = 0
    prev_row: tuple[Any, ...] | None = None
    deletions: dict[tuple[int, str], str] = msgspec.field(default_factory=dict)
    fast: bool = False  # the last file was checked by the parallel fast path
