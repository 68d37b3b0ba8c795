"""The audit database's layout and the head checkpoint kept outside it.

One SQLite file (``fluffy.db``, WAL mode) holds the audit log and the workflow tables.
``audit_meta`` keeps the chain's id, its anchor (where this file's chain starts: the
genesis or the last archived entry) and the head written in the same transaction as
the entries.  ``audit.head`` beside the database is the checkpoint *outside* the table:
deleting the newest rows, or restoring an older copy of the file, leaves the
checkpoint ahead of the database and is reported (a plain hash chain cannot see it).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fluffy.kernel.audit.entry import COLUMNS

DB_NAME: Final = "fluffy.db"
HEAD_NAME: Final = "audit.head"
ARCHIVE_DIR: Final = "audit-archive"
BACKUP_DIR: Final = "backups"
HEAD_SIZE: Final = 512  # the checkpoint is one fixed-size record, rewritten in place

AUDIT_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS audit_log (
    seq INTEGER PRIMARY KEY,
    timestamp INTEGER NOT NULL,
    prev_hash TEXT NOT NULL,
    event_type TEXT NOT NULL,
    syscall_type TEXT,
    tool_name TEXT,
    caller TEXT NOT NULL,
    session_id TEXT,
    session_mode TEXT NOT NULL,
    state_machine_state TEXT NOT NULL,
    policy_decision TEXT,
    policy_rule_name TEXT,
    capability_id TEXT,
    deny_reason TEXT,
    input_summary TEXT NOT NULL,
    output_summary TEXT,
    duration_ms REAL,
    sandbox_id TEXT,
    metadata TEXT,
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_log_time ON audit_log (timestamp);
CREATE TABLE IF NOT EXISTS audit_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- the few entries the verifier reads the metadata of, found without a table scan
CREATE INDEX IF NOT EXISTS audit_log_special ON audit_log (seq)
    WHERE event_type IN ('audit_archive_deleted', 'audit_chain_break');
"""

INSERT_SQL: Final = (
    f"INSERT INTO audit_log ({', '.join(COLUMNS)}, hash) "  # noqa: S608 (constant column names)
    f"VALUES ({', '.join('?' for _ in COLUMNS)}, ?)"
)
SELECT_ROWS: Final = f"SELECT {', '.join(COLUMNS)}, hash FROM audit_log"  # noqa: S608
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


@dataclass(frozen=True)
class Head:
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
        if not isinstance(chain, str) or not isinstance(seq, int) or not isinstance(hash_, str):
            raise ValueError("the checkpoint lacks chain_id, seq or hash")
        return cls(chain, seq, hash_)


class HeadFile:
    """``audit.head``: one padded JSON record rewritten in place (pwrite + fdatasync)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def write(self, head: Head, *, durable: bool) -> None:
        data = json.dumps(head.to_dict(), sort_keys=True).encode()
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
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the checkpoint {path} is garbled: {exc}") from exc
