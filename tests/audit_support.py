"""Editing an audit database the way someone with write access to the file would.

The table stores each entry whole (its canonical JSON in ``entry``) with copies of seq,
timestamp and event_type (``kernel/audit/store.py``).  Changing a field rewrites the
stored entry with that field changed (and the copy, for a copied field); the hash is
left as it was unless given.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from fluffy.kernel.audit.entry import COLUMNS, _encode
from fluffy.kernel.audit.store import SELECT_ROWS, unpack


def entry_fields(conn: sqlite3.Connection, seq: int) -> list[Any]:
    """Entry ``seq`` as the verifier reads it: its fields, then its hash."""
    stored = conn.execute(SELECT_ROWS + " WHERE seq = ?", (seq,)).fetchone()
    assert stored is not None, seq
    return list(unpack(stored))


def change_entry(conn: sqlite3.Connection, seq: int, /, **values: Any) -> None:
    """Set fields of entry ``seq`` as a reader would see them: a field in the stored entry
    (and in the table's copy, if it has one); ``seq`` and ``hash`` in their columns only
    (the entry keeps the number it was hashed with)."""
    _, timestamp, event_type, entry, hash_ = conn.execute(
        SELECT_ROWS + " WHERE seq = ?", (seq,)
    ).fetchone()
    fields = msgspec.json.decode(entry)
    for name, value in values.items():
        if name not in ("seq", "hash"):
            fields[COLUMNS.index(name)] = value
    changed = conn.execute(
        "UPDATE audit_log SET seq = ?, timestamp = ?, event_type = ?, entry = ?, hash = ? "
        "WHERE seq = ?",
        (
            values.get("seq", seq),
            values.get("timestamp", timestamp),
            values.get("event_type", event_type),
            _encode(fields),
            values.get("hash", hash_),
            seq,
        ),
    ).rowcount
    assert changed == 1, seq


def rewrite_in_earlier_layout(conn: sqlite3.Connection) -> None:
    """The layout fluffy used before entries were stored whole: a column per field."""
    rows = [unpack(row) for row in conn.execute(SELECT_ROWS + " ORDER BY seq")]
    names = (*COLUMNS, "hash")
    conn.executescript(
        "DROP TABLE audit_log; "
        "CREATE TABLE audit_log (seq INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, "
        + ", ".join(f"{c} {'REAL' if c == 'duration_ms' else 'TEXT'}" for c in names[2:])
        + ")"
    )
    marks = ", ".join("?" * len(names))
    conn.executemany(f"INSERT INTO audit_log ({', '.join(names)}) VALUES ({marks})", rows)
    conn.commit()
