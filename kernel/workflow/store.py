"""Persistence of sessions, their transitions and test runs (design: Persistence).

Same SQLite database as the audit log, separate tables.  ``state_log`` is chained like
the audit log (domain-separated canonical JSON, SHA-256, genesis ``"genesis:state"``):
every transition and every recorded test run appends a row whose ``data`` carries the
digest of the session's state after it and, for a test run, the digest of the run.  A
session row or a test run that no longer matches its chained digest is refused on load.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path
from typing import Any, Final

import aiosqlite
import msgspec

from fluffy.errors import WorkflowError
from fluffy.kernel.audit.entry import now_ms
from fluffy.kernel.audit.store import PRAGMAS, db_path
from fluffy.kernel.workflow import sessiondata
from fluffy.kernel.workflow.sessiondata import SessionData
from fluffy.kernel.workflow.states import Mode, State, is_mode, is_state

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
    mode TEXT NOT NULL, state TEXT NOT NULL, data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state_log (
    seq INTEGER PRIMARY KEY, session_id TEXT NOT NULL, timestamp INTEGER NOT NULL,
    event TEXT NOT NULL, from_state TEXT NOT NULL, to_state TEXT NOT NULL,
    mode TEXT NOT NULL, data TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS test_runs (
    id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, recorded_at INTEGER NOT NULL,
    state TEXT NOT NULL, run TEXT NOT NULL, coverage TEXT
);
CREATE TABLE IF NOT EXISTS review_diffs (
    audit_seq INTEGER PRIMARY KEY, session_id TEXT NOT NULL, diff TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS workflow_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
DOMAIN: Final = b"fluffy.state.v1\x00"
GENESIS: Final = hashlib.sha256(b"genesis:state").hexdigest()
_encode = msgspec.json.Encoder(order="sorted").encode


async def open_state_db(state_dir: Path, schema: str) -> aiosqlite.Connection:
    """A connection of its own to the state database (WAL shares the file), ``schema`` made."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    db = await aiosqlite.connect(db_path(state_dir))
    for pragma in PRAGMAS:
        await db.execute(pragma)
    await db.executescript(schema)
    await db.commit()
    return db


def digest(value: Any) -> str:
    return hashlib.sha256(_encode(value)).hexdigest()


def row_hash(row: tuple[Any, ...]) -> str:
    return hashlib.sha256(DOMAIN + _encode(row)).hexdigest()


class SessionRow(msgspec.Struct, frozen=True):
    id: str
    created_at: int
    updated_at: int
    mode: Mode
    state: State
    data: SessionData = msgspec.field(default_factory=SessionData)


class Outcome(msgspec.Struct, frozen=True):
    """What a transition did (warnings: e.g. a coverage drop that was allowed)."""

    session: SessionRow
    from_state: str
    event: str
    warnings: list[str] = msgspec.field(default_factory=list)


class WorkflowStore:
    """Async access to the workflow tables (its own connection; WAL lets it share the file)."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db
        #: Sessions as this store last verified or wrote them.  The kernel is the only
        #: writer, so a tool call does not re-read and re-verify the chain every time;
        #: changes from outside are found at start-up and by `fluffy audit verify`.
        self._sessions: dict[str, SessionRow] = {}
        self._writing = asyncio.Lock()

    @classmethod
    async def open(cls, state_dir: Path) -> WorkflowStore:
        return cls(await open_state_db(state_dir, SCHEMA))

    async def close(self) -> None:
        await self.db.close()

    # -- chained writes -----------------------------------------------------------------
    async def _append(
        self,
        session_id: str,
        event: str,
        from_state: str,
        to_state: str,
        mode: str,
        data: dict[str, Any],
    ) -> None:
        rows = list(
            await self.db.execute_fetchall(
                "SELECT seq, hash FROM state_log ORDER BY seq DESC LIMIT 1"
            )
        )
        seq, prev = (int(rows[0][0]) + 1, str(rows[0][1])) if rows else (1, GENESIS)
        row = (
            seq,
            session_id,
            now_ms(),
            event,
            from_state,
            to_state,
            mode,
            _encode(data).decode(),
            prev,
        )
        await self.db.execute(
            "INSERT INTO state_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (*row, row_hash(row))
        )

    async def save(
        self, session: SessionRow, event: str, from_state: str, note: dict[str, Any]
    ) -> None:
        """Write the session and its chained transition row in one transaction."""
        async with self._writing:
            await self._save(session, event, from_state, note)

    async def _save(
        self, session: SessionRow, event: str, from_state: str, note: dict[str, Any]
    ) -> None:
        self._sessions.pop(session.id, None)  # a failed write leaves no guess behind
        try:
            data = _encode(session.data).decode()
            await self.db.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                "updated_at = excluded.updated_at, mode = excluded.mode, state = excluded.state, "
                "data = excluded.data",
                (
                    session.id,
                    session.created_at,
                    session.updated_at,
                    session.mode,
                    session.state,
                    data,
                ),
            )
            chained = {**note, "session": digest([session.mode, session.state, session.data])}
            await self._append(session.id, event, from_state, session.state, session.mode, chained)
            await self.db.commit()
        except BaseException:
            await self.db.rollback()  # nothing half-written is read back
            raise
        self._sessions[session.id] = session

    async def add_test_run(
        self,
        session_id: str,
        state: str,
        mode: str,
        run: dict[str, Any],
        coverage: dict[str, Any] | None,
    ) -> int:
        async with self._writing:
            return await self._add_test_run(session_id, state, mode, run, coverage)

    async def _add_test_run(
        self,
        session_id: str,
        state: str,
        mode: str,
        run: dict[str, Any],
        coverage: dict[str, Any] | None,
    ) -> int:
        cursor = await self.db.execute(
            "INSERT INTO test_runs (session_id, recorded_at, state, run, coverage) "
            "VALUES (?, ?, ?, ?, ?)",
            (
                session_id,
                now_ms(),
                state,
                _encode(run).decode(),
                None if coverage is None else _encode(coverage).decode(),
            ),
        )
        run_id = int(cursor.lastrowid or 0)
        note = {"run_id": run_id, "run": digest([run, coverage])}
        await self._append(session_id, "test_run_recorded", state, state, mode, note)
        await self.db.commit()
        return run_id

    # -- reads (verified against the chain) -----------------------------------------------
    async def _chained(self, session_id: str, event: str | None = None) -> list[dict[str, Any]]:
        query = "SELECT data FROM state_log WHERE session_id = ?"
        params: list[Any] = [session_id]
        if event is not None:
            query += " AND event = ?"
            params.append(event)
        rows = await self.db.execute_fetchall(query + " ORDER BY seq", params)
        return [msgspec.json.decode(row[0]) for row in rows]

    async def load(self, session_id: str) -> SessionRow | None:
        cached = self._sessions.get(session_id)
        if cached is not None:
            return cached
        # the connection sees its own uncommitted writes: a load between a save's two
        # statements would find the new row without its chained note
        async with self._writing:
            return await self._load(session_id)

    async def _load(self, session_id: str) -> SessionRow | None:
        cached = self._sessions.get(session_id)
        if cached is not None:
            return cached
        rows = list(
            await self.db.execute_fetchall(
                "SELECT id, created_at, updated_at, mode, state, data FROM sessions WHERE id = ?",
                (session_id,),
            )
        )
        if not rows:
            return None
        raw = rows[0]
        mode, state = raw[3], raw[4]
        if not is_mode(mode) or not is_state(state):  # only the kernel writes these
            raise WorkflowError(
                f"session {session_id} has an unknown mode or state ({mode!r}, {state!r})",
                why="the session row holds a value the workflow never writes",
                fix="Run `fluffy audit verify`; then leave (/quit) and run `fluffy` again: a new "
                "session starts.",
            )
        stored = msgspec.json.decode(raw[5])  # the chain covers the bytes as written
        notes = [n for n in await self._chained(session_id) if "session" in n]
        if not notes or notes[-1]["session"] != digest([mode, state, stored]):
            raise WorkflowError(
                f"session {session_id} does not match its chained state log",
                why="the session row was changed outside the kernel",
                fix="Run `fluffy audit verify`; then leave (/quit) and run `fluffy` again: a new "
                "session starts.",
            )
        try:
            data = sessiondata.decode(stored)
        except ValueError as exc:
            raise WorkflowError(
                f"session {session_id} holds data the workflow never writes ({exc})",
                why="its chained state log vouches for it, so this kernel cannot read what another "
                "version wrote",
                fix="Leave (/quit) and run `fluffy` again: a new session starts.",
            ) from None
        session = SessionRow(raw[0], raw[1], raw[2], mode, state, data)
        self._sessions[session_id] = session
        return session

    async def history(self, session_id: str) -> list[dict[str, Any]]:
        """The session's chained transitions, oldest first."""
        rows = await self.db.execute_fetchall(
            "SELECT seq, timestamp, event, from_state, to_state, mode FROM state_log "
            "WHERE session_id = ? ORDER BY seq",
            (session_id,),
        )
        keys = ("seq", "timestamp", "event", "from", "to", "mode")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    async def recent_sessions(self, limit: int = 20) -> list[SessionRow]:
        """The most recently updated sessions (each verified against its chain)."""
        rows = await self.db.execute_fetchall(
            "SELECT id FROM sessions ORDER BY updated_at DESC, rowid DESC LIMIT ?", (limit,)
        )
        found = [await self.load(str(row[0])) for row in rows]
        return [session for session in found if session is not None]

    async def latest_session(self) -> str | None:
        rows = list(
            await self.db.execute_fetchall(
                "SELECT id FROM sessions ORDER BY updated_at DESC, rowid DESC LIMIT 1"
            )
        )
        return str(rows[0][0]) if rows else None

    async def latest_run(
        self, session_id: str
    ) -> tuple[int, dict[str, Any], dict[str, Any] | None] | None:
        async with self._writing:  # never between a run's row and its chained note
            return await self._latest_run(session_id)

    async def _latest_run(
        self, session_id: str
    ) -> tuple[int, dict[str, Any], dict[str, Any] | None] | None:
        rows = list(
            await self.db.execute_fetchall(
                "SELECT id, run, coverage FROM test_runs WHERE session_id = ? "
                "ORDER BY id DESC LIMIT 1",
                (session_id,),
            )
        )
        if not rows:
            return None
        run_id, run_raw, cov_raw = rows[0]
        run = msgspec.json.decode(run_raw)
        coverage = msgspec.json.decode(cov_raw) if cov_raw else None
        chained = {
            n["run_id"]: n["run"] for n in await self._chained(session_id, "test_run_recorded")
        }
        if chained.get(run_id) != digest([run, coverage]):
            raise WorkflowError(
                f"test run {run_id} does not match its chained digest",
                why="the recorded run was changed outside the kernel; it is not evidence",
                fix="Run the tests again with test.run.",
            )
        return int(run_id), run, coverage

    async def latest_run_id(self, session_id: str) -> int:
        """The id of the session's newest recorded run (0: none), unverified: a threshold."""
        rows = list(
            await self.db.execute_fetchall(
                "SELECT MAX(id) FROM test_runs WHERE session_id = ?", (session_id,)
            )
        )
        return int(rows[0][0] or 0) if rows else 0

    async def keep_diff(self, audit_seq: int, session_id: str, diff: str) -> None:
        """The whole diff a merge decision was about, under its audit entry's number (the
        entry keeps a preview and the diff's SHA-256: the web view checks one by the
        other)."""
        async with self._writing:
            await self.db.execute(
                "INSERT OR REPLACE INTO review_diffs VALUES (?, ?, ?)",
                (audit_seq, session_id, diff),
            )
            await self.db.commit()

    async def delete_meta(self, key: str) -> None:
        async with self._writing:  # a commit here must not commit half of a save
            await self.db.execute("DELETE FROM workflow_meta WHERE key = ?", (key,))
            await self.db.commit()

    async def get_meta(self, key: str) -> str | None:
        rows = list(
            await self.db.execute_fetchall("SELECT value FROM workflow_meta WHERE key = ?", (key,))
        )
        return str(rows[0][0]) if rows else None

    async def set_meta(self, key: str, value: str) -> None:
        async with self._writing:  # a commit here must not commit half of a save
            await self.db.execute(
                "INSERT OR REPLACE INTO workflow_meta VALUES (?, ?)", (key, value)
            )
            await self.db.commit()


def verify_state_log(path: Path) -> tuple[bool, int, str]:
    """Recompute the state chain: (ok, rows, detail of the first break)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        prev, count = GENESIS, 0
        for row in conn.execute(
            "SELECT seq, session_id, timestamp, event, from_state, to_state, mode, data, "
            "prev_hash, hash FROM state_log ORDER BY seq"
        ):
            if row[8] != prev or row_hash(tuple(row[:9])) != row[9] or row[0] != count + 1:
                return (
                    False,
                    count,
                    f"state log entry {row[0]} is modified, inserted or out of order",
                )
            prev, count = row[9], count + 1
        return True, count, ""
    except sqlite3.OperationalError:
        return True, 0, ""
    finally:
        conn.close()
