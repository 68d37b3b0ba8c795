"""Is a file's ``audit_log`` a table the log writes, with entries the log writes?

The layout check runs before a file is scanned; the encoding check covers the entries
appended after the witnessed head when the fast path checked the file.
"""

from __future__ import annotations

import sqlite3

from fluffy.kernel.audit.chainrows import read_rows, recompute_hash
from fluffy.kernel.audit.findings import Problem
from fluffy.kernel.audit.store import HEAD_COLUMN, STORED

# a table written before ADR-099 has no head column (its head is in audit_meta)
LAYOUTS = ((*STORED, HEAD_COLUMN), STORED)


def appended_problem(conn: sqlite3.Connection, name: str, after: int) -> Problem | None:
    """The first entry after ``after`` whose stored bytes are not its canonical encoding.

    The fast check hashes the stored bytes; up to the witnessed head they are what the
    log wrote.  Entries after it were hashed by whoever appended them: decoded and
    encoded again, each must give the same hash (as the sequential scan requires).
    """
    for row in read_rows(conn, after):
        if recompute_hash(row[:-1]) != row[-1]:
            seq = int(row[0])
            return Problem(
                "modified",
                seq,
                name,
                f"entry {seq} is not an entry the log writes (its stored bytes are not the "
                "canonical encoding of its fields, or a copy in the table differs from it)",
            )
    return None


def layout_problem(conn: sqlite3.Connection, name: str, after: int) -> Problem | None:
    """What is wrong with the file's ``audit_log`` as a table the log writes, if anything.

    It must exist, have the columns of one of :data:`LAYOUTS`, and be a table whose
    ``seq`` is the row id.  As the row id every entry has a distinct integer seq; a table
    rebuilt otherwise (or a view) can hold NULL, REAL or repeated numbers, which the
    checks (and ``seq BETWEEN``) do not see.  SQLite reads a row-id alias with its
    ``Rowid`` opcode, any other column with ``Column``.
    """
    kind = conn.execute("SELECT type FROM sqlite_schema WHERE name = 'audit_log'").fetchone()
    if kind is None:
        return Problem(
            "truncated",
            after + 1,
            name,
            "the file has no audit_log table (the log creates it before it writes anything)",
        )
    columns = tuple(row[1] for row in conn.execute("PRAGMA table_info(audit_log)"))
    if columns not in LAYOUTS:
        if "entry" not in columns and "input_summary" in columns:
            return Problem(
                "modified",
                None,
                name,
                "the file has the audit layout of an earlier fluffy: start fluffy once (the "
                "kernel converts the database, its archives and backups), then verify again",
            )
        return Problem(
            "modified",
            None,
            name,
            f"the audit_log table has the columns {', '.join(columns)}, not "
            f"{', '.join(LAYOUTS[0])} (the log never creates such a table)",
        )
    try:
        plan = conn.execute("EXPLAIN SELECT seq FROM audit_log NOT INDEXED")  # the table itself
        opcodes = {row[1] for row in plan}
    except sqlite3.Error:
        opcodes = set()
    if kind != ("table",) or "Rowid" not in opcodes or "Column" in opcodes:
        return Problem(
            "modified",
            None,
            name,
            "the audit_log table was rebuilt: seq is no longer its row id, so entries "
            "can lack a number or share one (the log never creates such a table)",
        )
    return None


def own_head(conn: sqlite3.Connection, meta_seq: int) -> tuple[int, int | None]:
    """The head a file records for itself: ``(seq, mark)``.

    ``meta_seq`` is ``audit_meta``'s copy: exact in an archive and in a file written
    before ADR-099, a lower bound since (moved at checkpoints and at close).  The writer
    marks the newest row in the same transaction that adds it, so ``seq`` is the newest
    entry the file says it had: its last row when that is marked; one more when it is
    not and no row is (the marked end was cut off).  ``mark`` is the newest marked entry
    when rows follow it: those the log did not append (None otherwise).
    """
    columns = {row[1] for row in conn.execute("PRAGMA table_info(audit_log)")}
    if HEAD_COLUMN not in columns:
        return meta_seq, None
    last = conn.execute("SELECT seq, head IS 1 FROM audit_log ORDER BY seq DESC LIMIT 1").fetchone()
    if last is None or type(last[0]) is not int:
        return meta_seq, None
    seq, marked = last
    if marked or meta_seq >= seq:  # (an older fluffy that appended moved audit_meta's)
        return max(meta_seq, seq), None
    mark = conn.execute("SELECT MAX(seq) FROM audit_log WHERE head IS 1").fetchone()[0]
    if type(mark) is int:
        return seq, mark
    return seq + 1, None
