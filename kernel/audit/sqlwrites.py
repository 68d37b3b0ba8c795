"""What the audit writer runs against its connection: a batch's commit, a WAL checkpoint.

:func:`write_batch` is the whole of a commit (multi-row inserts, the head's mark moved
to the newest row, ``commit``, then the ``audit.head`` checkpoint file); the writer runs it
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
# audit_meta's copy of the head (a chain's first commit, each WAL checkpoint, the close:
# ADR-099) moves in place once its two rows exist: an UPDATE changes one page, where
# INSERT OR REPLACE deletes and re-inserts both rows and changes its key index too.
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


# The head's mark moves in single-row statements (marking both rows with one ``IN`` took
# ~2 µs more of the ~14 µs a one-row commit costs SQLite), the old one unmarked first: a
# big batch's early pages are spilled to the WAL before it commits, and changing one of
# them again made the commit rewrite the checksum of every frame after it (~17 ms more
# for 50,000 rows).
INSERT_HEAD_SQL = (
    "INSERT INTO audit_log (seq, timestamp, event_type, entry, hash, head)"
    " VALUES (?, ?, ?, ?, ?, 1)"
)
UNMARK_SQL = "UPDATE audit_log SET head = 0 WHERE seq = ?"
MARK_SQL = "UPDATE audit_log SET head = 1 WHERE seq = ?"


def insert_rows(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``rows`` (contiguous, after the file's newest) and move the head's mark to
    the last of them."""
    conn.execute(UNMARK_SQL, (rows[0][0] - 1,))
    if len(rows) == 1:
        conn.execute(INSERT_HEAD_SQL, rows[0])
        return
    flat = chain.from_iterable
    for start in range(0, len(rows), INSERT_ROWS):
        part = rows[start : start + INSERT_ROWS]
        conn.execute(insert_sql(len(part)), list(flat(part)))
    conn.execute(MARK_SQL, (rows[-1][0],))


def write_batch(
    conn: sqlite3.Connection,
    rows: Sequence[tuple[Any, ...]],
    new_chain: str | None,
    headfile: HeadFile,
    head: Head | None,
) -> OSError | None:
    """Runs on the connection's thread: one transaction, then the checkpoint file.

    The rows, the chain id and the head's mark (on the newest row, taken from the row
    before them) commit together (``synchronous=FULL``: durable when ``commit`` returns);
    only then is ``audit.head`` rewritten, so it never runs ahead of the database.  A
    failed commit raises (nothing is kept); a failed checkpoint write is returned (the
    rows are committed).
    """
    try:
        if new_chain:
            conn.execute(CHAIN_SQL, (new_chain,))
        if rows:
            insert_rows(conn, rows)
            if new_chain:  # audit_meta's copy starts with the chain
                conn.execute(HEAD_SQL, (rows[-1][0], rows[-1][-1]))
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


def save_head(conn: sqlite3.Connection, head: Head) -> None:
    """Copy the committed ``head`` to ``audit_meta`` (its own transaction): the file's
    evidence of its end that survives every row of the table being deleted.  Only a row
    the writer marked is copied: a file opened with its marked end cut off, and closed
    before a commit, keeps the copy that says so."""
    marked = "SELECT 1 FROM audit_log WHERE seq = ? AND hash = ? AND head = 1"
    row = (head.seq, head.hash)
    if not head.seq or conn.execute(marked, row).fetchone() is None:
        return
    try:
        if conn.execute(MOVE_HEAD_SQL, row).rowcount != 2:
            conn.execute(HEAD_SQL, row)
        conn.commit()
    except BaseException:
        with contextlib.suppress(Exception):
            conn.rollback()
        raise


def wal_checkpoint(conn: sqlite3.Connection, headfile: HeadFile, head: Head) -> str:
    """Runs on the connection's thread: ``head`` to ``audit_meta``, RESTART checkpoint,
    then fsync ``audit.head``."""
    error = ""
    try:
        save_head(conn, head)
    except sqlite3.Error as exc:  # the lock taken: the next checkpoint copies it
        error = f"audit_meta's head not written: {exc}"
    try:
        conn.execute(f"PRAGMA wal_checkpoint({CHECKPOINT_MODE})")
    except sqlite3.Error as exc:  # a long reader: try again next time
        error = error or str(exc)
    try:
        headfile.sync()
    except OSError as exc:
        error = error or f"audit.head not synced: {exc}"
    return error


def final_checkpoint(conn: sqlite3.Connection, head: Head) -> None:
    """At close: ``head`` to ``audit_meta``, then the WAL into the file, truncated."""
    try:
        save_head(conn, head)
    finally:  # the checkpoint is made even when the copy could not be
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
