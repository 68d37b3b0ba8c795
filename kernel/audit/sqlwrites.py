"""What the audit writer runs against its connection: a batch's commit, a WAL checkpoint.

:func:`write_batch` is the whole of a commit (multi-row inserts, the head in
``audit_meta``, ``commit``, then the ``audit.head`` checkpoint file); the writer runs it
on the connection's thread, or through :func:`write_now` on the event loop's own thread
when the write lock is free at once (ADR-026, see :mod:`fluffy.kernel.audit.log`).
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Sequence
from itertools import chain
from typing import Any

from fluffy.kernel.audit.store import INSERT_SQL, STORED, Head, HeadFile

# RESTART (not TRUNCATE) keeps the WAL file, so the next commits overwrite it in place
# and their fdatasync need not grow the file (ext4 journals every size change: on the
# benchmark machine a durable one-row commit into a reused WAL took ~80 µs less than
# into a growing one, of ~300 µs).  journal_size_limit bounds what is kept (SQLite
# trims the WAL to it at the first commit after a checkpoint); close() still truncates.
CHECKPOINT_MODE = "RESTART"
HEAD_SQL = "INSERT OR REPLACE INTO audit_meta VALUES ('head_seq', ?), ('head_hash', ?)"
# Once the two rows exist, the head moves in place: an UPDATE changes one page of
# audit_meta (its table), where INSERT OR REPLACE deletes and re-inserts both rows and
# changes its key index too: a one-row commit writes 3.3 WAL frames instead of 4.3.
MOVE_HEAD_SQL = (
    "UPDATE audit_meta SET value = CASE key WHEN 'head_seq' THEN ?1 ELSE ?2 END"
    " WHERE key IN ('head_seq', 'head_hash')"
)
CHAIN_SQL = "INSERT OR REPLACE INTO audit_meta VALUES ('chain_id', ?)"


# Rows go in by multi-row INSERTs of up to INSERT_ROWS rows: executemany steps every row
# on its own (and drops and retakes the GIL around each step); one statement per 100
# rows made the benchmark's buffered figure ~10 % better.
INSERT_ROWS = 100


@functools.lru_cache(maxsize=INSERT_ROWS)
def insert_sql(count: int) -> str:
    one = "(" + ", ".join("?" * len(STORED)) + ")"
    return INSERT_SQL + (", " + one) * (count - 1)


def insert_rows(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    flat = chain.from_iterable
    for start in range(0, len(rows), INSERT_ROWS):
        part = rows[start : start + INSERT_ROWS]
        conn.execute(insert_sql(len(part)), list(flat(part)))


def write_batch(
    conn: sqlite3.Connection,
    rows: Sequence[tuple[Any, ...]],
    new_chain: str | None,
    headfile: HeadFile,
    head: Head | None,
) -> OSError | None:
    """Runs on the connection's thread: one transaction, then the checkpoint file.

    The rows, the chain id and the head in ``audit_meta`` commit together
    (``synchronous=FULL``: durable when ``commit`` returns); only then is ``audit.head``
    rewritten, so it never runs ahead of the database.  A failed commit raises (nothing
    is kept); a failed checkpoint write is returned (the rows are committed).
    """
    try:
        if new_chain:
            conn.execute(CHAIN_SQL, (new_chain,))
        if rows:
            insert_rows(conn, rows)
            head_row = (rows[-1][0], rows[-1][-1])
            if conn.execute(MOVE_HEAD_SQL, head_row).rowcount != 2:  # a chain's first
                conn.execute(HEAD_SQL, head_row)
        conn.commit()
    except BaseException:
        with contextlib.suppress(Exception):
            conn.rollback()
        raise
    if head is not None:
        try:
            headfile.write(head, durable=False)
        except OSError as exc:
            return exc
    return None


def write_now(conn: sqlite3.Connection, *args: Any) -> tuple[bool, OSError | None]:
    """:func:`write_batch` on the event loop's thread, never waiting for a lock.

    The kernel's other connections to the file (workflow store, conversations) can hold
    the write lock across an ``await``; waiting here (``busy_timeout``) would block the
    very loop that must run for them to commit.  So the transaction is taken at once
    (``BEGIN IMMEDIATE``; the caller has set no busy timeout) or not at all:
    ``(False, None)`` then, and the caller hands the batch to the connection's thread,
    which may wait.
    """
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return False, None
        raise
    try:
        return True, write_batch(conn, *args)
    except BaseException:
        if conn.in_transaction:  # write_batch rolls back; never leave one open
            with contextlib.suppress(Exception):
                conn.rollback()
        raise


def wal_checkpoint(conn: sqlite3.Connection, headfile: HeadFile) -> str:
    """Runs on the connection's thread: RESTART checkpoint, then fsync ``audit.head``."""
    error = ""
    try:
        conn.execute(f"PRAGMA wal_checkpoint({CHECKPOINT_MODE})")
    except sqlite3.Error as exc:  # a long reader: try again next time
        error = str(exc)
    try:
        headfile.sync()
    except OSError as exc:
        error = error or f"audit.head not synced: {exc}"
    return error
