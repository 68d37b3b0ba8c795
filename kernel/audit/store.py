"""The audit database's layout and the head checkpoint kept outside it.

One SQLite file (``fluffy.db``, WAL mode) holds the audit log and the workflow tables.
``audit_meta`` keeps the chain's id and its anchor (where this file's chain starts: the
genesis or the last archived entry).  The file's own head is the newest entry's row,
marked (``head`` = 1) in the same transaction that adds it, and copied to ``audit_meta``
at each WAL checkpoint and at close (ADR-099).  ``audit.head`` beside the database is
the checkpoint *outside* the table:
deleting the newest rows, or restoring an older copy of the file, leaves the
checkpoint ahead of the database and is reported (a plain hash chain cannot see it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any, Final

import msgspec

from fluffy.kernel.audit.entry import COLUMNS, EVENT_TYPES, REQUIRED, _encode, digest

DB_NAME: Final = "fluffy.db"
HEAD_NAME: Final = "audit.head"
ARCHIVE_DIR: Final = "audit-archive"
BACKUP_DIR: Final = "backups"
HEAD_SIZE: Final = 512  # the checkpoint is one fixed-size record, rewritten in place

# One row per entry.  ``entry`` is the entry itself: the canonical JSON array of its
# fields (entry.COLUMNS order), exactly the bytes its hash covers.  ``seq`` (the row id),
# ``timestamp`` and ``event_type`` repeat fields of it for the indexes; the verifier
# checks that every one of them matches the entry (see entry.py and ranges.py).
AUDIT_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS audit_log (
    seq INTEGER PRIMARY KEY,
    timestamp INTEGER NOT NULL,
    event_type TEXT NOT NULL,
    entry BLOB NOT NULL,
    hash TEXT NOT NULL,
    head INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS audit_log_time ON audit_log (timestamp);
CREATE TABLE IF NOT EXISTS audit_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- the few entries the verifier reads the metadata of, found without a table scan
CREATE INDEX IF NOT EXISTS audit_log_special ON audit_log (seq)
    WHERE event_type IN ('audit_archive_deleted', 'audit_chain_break');
"""
STORED: Final = ("seq", "timestamp", "event_type", "entry", "hash")
# ``head``: 1 on the file's newest entry, 0 on every other (ADR-099).  Every commit moves
# the mark from the entry before its first row to its last; both rows are nearly always
# on the table's rightmost page, which the commit writes anyway, so the file's own head
# costs no page of its own (moving it in ``audit_meta`` cost one more WAL frame each).
HEAD_COLUMN: Final = "head"
MARK_HEAD_SQL: Final = "UPDATE audit_log SET head = (seq = ?2) WHERE seq IN (?1, ?2)"
# A file written before the mark kept its head in audit_meta, moved with every commit:
# its newest entry is marked only when that head names it (a cut-off end stays visible).
_ADD_HEAD_SQL = "ALTER TABLE audit_log ADD COLUMN head INTEGER NOT NULL DEFAULT 0"
_MARK_FROM_META_SQL = (
    "UPDATE audit_log SET head = 1 WHERE seq = (SELECT MAX(seq) FROM audit_log)"
    " AND CAST(seq AS TEXT) = (SELECT value FROM audit_meta WHERE key = 'head_seq')"
)
INSERT_SQL: Final = (
    "INSERT INTO audit_log (seq, timestamp, event_type, entry, hash) VALUES (?, ?, ?, ?, ?)"
)
SELECT_ROWS: Final = "SELECT seq, timestamp, event_type, entry, hash FROM audit_log"


def field_sql(name: str) -> str:
    """SQL for one field of the stored entry (NULL when the entry is not JSON)."""
    text = "CAST(entry AS TEXT)"
    return (
        f"(CASE WHEN json_valid({text}) THEN json_extract({text}, '$[{COLUMNS.index(name)}]') END)"
    )


def unpack(stored: tuple[Any, ...]) -> tuple[Any, ...]:
    """A stored row as (the values of entry.COLUMNS..., hash): what the verifier hashes.

    ``seq`` is the row id and ``timestamp`` and ``event_type`` the table's copies; every
    other value comes from ``entry``.  The row is *poisoned* (every field from the entry
    None, so no hash of the log matches it) when the stored bytes are not exactly the
    canonical encoding of what the row shows: an entry that is not a JSON array of
    values of the right types, not canonical JSON, or whose timestamp or event type
    differs from the copy (or is no event type the log writes).  Only the seq may
    differ from the entry's own, when the entry still has its hash (the row then names
    the new number, whose hash does not match: how the verifier tells a renumbered
    entry).  So a row whose canonical JSON hashes to the stored hash has exactly the
    stored entry as its bytes (barring SHA-256 collisions), and the fast check (hashing
    the bytes as stored) can agree with it.
    """
    seq, timestamp, event_type, entry, hash_ = stored
    values = _decoded(entry)
    if (
        values is None
        or values[1] != timestamp
        or type(timestamp) is not int
        or values[3] != event_type
        or event_type not in EVENT_TYPES
        or _encode(values) != entry
        or (values[0] != seq and digest(entry) != hash_)
    ):
        values = [None] * len(COLUMNS)
    values[0], values[1], values[3] = seq, timestamp, event_type
    return (*values, hash_)


_TYPES: Final = tuple(
    (int,)
    if name in ("seq", "timestamp")
    else (float, type(None))
    if name == "duration_ms"
    else (str,)
    if name in REQUIRED
    else (str, type(None))
    for name in COLUMNS
)


def _decoded(entry: Any) -> list[Any] | None:
    if type(entry) is not bytes:
        return None
    try:
        values = msgspec.json.decode(entry)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    if type(values) is not list or len(values) != len(COLUMNS):
        return None
    for value, types in zip(values, _TYPES, strict=True):
        if type(value) not in types:
            return None
    return values


BUSY_TIMEOUT_MS: Final = 5000
PRAGMAS: Final = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
    "PRAGMA foreign_keys=ON",
)


def db_path(state_dir: Path) -> Path:
    return state_dir / DB_NAME


def head_path(state_dir: Path) -> Path:
    return state_dir / HEAD_NAME


def connect_ro(path: Path) -> sqlite3.Connection:
    """A read-only connection (readers never block the writer in WAL mode)."""
    if not path.exists():
        raise FileNotFoundError(path)
    # quoted: '?', '#' and '%' in a folder's name would otherwise end or alter the URI
    conn = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True, timeout=5.0)
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def read_meta(conn: sqlite3.Connection) -> dict[str, str]:
    try:
        return dict(conn.execute("SELECT key, value FROM audit_meta").fetchall())
    except sqlite3.OperationalError:
        return {}


async def fetch_meta(db: Any) -> dict[str, str]:
    """``audit_meta`` through an aiosqlite connection."""
    rows = await db.execute_fetchall("SELECT key, value FROM audit_meta")
    return {str(key): str(value) for key, value in rows}


class Head(msgspec.Struct, frozen=True):
    """The newest entry of a chain, as witnessed outside the database."""

    chain_id: str
    seq: int
    hash: str

    def to_dict(self) -> dict[str, Any]:
        return {"chain_id": self.chain_id, "seq": self.seq, "hash": self.hash}

    @classmethod
    def from_dict(cls, data: Any) -> Head:
        if not isinstance(data, dict):
            raise ValueError("the checkpoint is not a JSON object")
        chain, seq, hash_ = data.get("chain_id"), data.get("seq"), data.get("hash")
        if not isinstance(chain, str) or type(seq) is not int or not isinstance(hash_, str):
            raise ValueError("the checkpoint lacks chain_id, seq or hash")
        if not 0 <= seq < 2**63:
            raise ValueError(f"the checkpoint's seq {seq} is not an entry number")
        return cls(chain, seq, hash_)


def _json_text(value: str) -> bytes:
    if value.isascii() and value.isalnum():  # hex digits: nothing to escape
        return b'"%b"' % value.encode()
    return json.dumps(value).encode()


class HeadFile:
    """``audit.head``: one padded JSON record rewritten in place (pwrite + fdatasync)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._start = ("", b"")  # a chain id and the record's start naming it

    def write(self, head: Head, *, durable: bool) -> None:
        # the JSON of head.to_dict() with sorted keys, formatted directly: this runs after
        # every commit of a security event (json.dumps took ~10 µs of its ~0.37 ms)
        chain_id, start = self._start
        if head.chain_id != chain_id or not start:
            start = b'{"chain_id": %b, "hash": ' % _json_text(head.chain_id)
            self._start = (head.chain_id, start)
        data = b'%b%b, "seq": %d}' % (start, _json_text(head.hash), head.seq)
        os.pwrite(self._fd, data.ljust(HEAD_SIZE, b" ")[:HEAD_SIZE], 0)
        if durable:
            os.fdatasync(self._fd)

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def read_head(path: Path) -> Head | None:
    """The checkpoint, or None when there is none; a garbled one raises ValueError."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if not raw.strip():
        return None
    try:
        return Head.from_dict(json.loads(raw.decode()))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"the checkpoint {path} is garbled: {exc}") from exc


def _representable(value: Any, column: str) -> Any:
    """``value`` if the canonical JSON holds it faithfully, else a text that cannot match.

    The earlier layout stored every field in its own column; a type the log never
    writes there (a BLOB, a REAL where text belongs, an infinite number) must not turn,
    once encoded, into a value the hash accepts.
    """
    kind = type(value)
    if kind is bytes or (kind is float and (column != "duration_ms" or not math.isfinite(value))):
        return f"<unrepresentable {kind.__name__} {value!r}>"
    return value


def _text(raw: bytes) -> str:
    """TEXT as str; bytes that are not UTF-8 (the log never stores them) as a text that
    cannot match the hash, so the conversion goes through and verify finds the change."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return f"<unrepresentable text {raw!r}>"


def add_head_column(conn: sqlite3.Connection) -> bool:
    """Give a table of the layout before ADR-099 its ``head`` column (committed); False
    when it has one already, or is not that layout."""
    columns = tuple(row[1] for row in conn.execute("PRAGMA table_info(audit_log)"))
    if columns != STORED:
        return False
    conn.execute("BEGIN IMMEDIATE")  # the column and the mark together, or neither
    try:
        if tuple(row[1] for row in conn.execute("PRAGMA table_info(audit_log)")) != STORED:
            conn.rollback()  # another process added it meanwhile
            return False
        conn.execute(_ADD_HEAD_SQL)
        conn.execute(_MARK_FROM_META_SQL)
    except BaseException:
        conn.rollback()
        raise
    conn.commit()
    return True


def create_tables(conn: sqlite3.Connection) -> None:
    """The audit tables and indexes, as they must be before the writer's first commit."""
    conn.executescript(AUDIT_SCHEMA)
    add_head_column(conn)


def migrate_layout(path: Path) -> int | None:
    """Convert a database of an earlier layout in place.

    One column per field (the first layout) becomes the stored entry: the hashes do not
    change (the canonical encoding is the same), so the chain still verifies, and a value
    changed before the conversion still fails.  A table without the ``head`` column gets
    it.  Returns the number of entries converted, None when the file has this layout
    already (or no log).
    """
    conn = sqlite3.connect(path, isolation_level=None)
    conn.text_factory = _text
    try:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(audit_log)")]
        if "entry" in columns or "input_summary" not in columns:  # not the first layout
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            if not add_head_column(conn):
                return None
            return int(conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()[0])
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("ALTER TABLE audit_log RENAME TO audit_log_v1")
            conn.execute("DROP INDEX IF EXISTS audit_log_time")
            conn.execute("DROP INDEX IF EXISTS audit_log_special")
            for statement in AUDIT_SCHEMA.split(";"):
                conn.execute(statement)
            old = conn.execute(
                f"SELECT {', '.join(COLUMNS)}, hash FROM audit_log_v1 ORDER BY seq"  # noqa: S608
            )
            count = 0
            while batch := old.fetchmany(4096):
                conn.executemany(
                    INSERT_SQL,
                    [
                        (
                            row[0],
                            row[1],
                            row[3],
                            _encode(
                                [_representable(v, c) for v, c in zip(row, COLUMNS, strict=False)]
                            ),
                            row[-1],
                        )
                        for row in batch
                    ],
                )
                count += len(batch)
            conn.execute("DROP TABLE audit_log_v1")
            conn.execute(_MARK_FROM_META_SQL)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return count
    finally:
        conn.close()
