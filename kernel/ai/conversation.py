"""Conversation history on the state database (design: Session Management).

Same SQLite file as the audit log and the workflow (``db_path(state_dir)``), its own
connection and tables:

- ``conversation``: one row per message, ``(session_id, seq)`` ordered, the message as
  msgspec JSON of the shared :class:`~fluffy.ipc.ai_types.Message`;
- ``conversation_meta``: per session the title (the first user message, 60
  characters), the running summary and how many messages it covers
  (``summarised_upto``), the user's pins, the number of user turns;
- ``conversation_archive``: messages of sessions idle for more than 30 days, moved
  there by :meth:`ConversationStore.prune` (their meta row stays, marked archived);
- ``ai_usage``: the providers' token counts per turn and model
  (:mod:`fluffy.kernel.ai.usage`).

Only messages are stored.  The store never sees provider credentials: it accepts
:class:`Message` values only, and known secret shapes in message text are redacted
(:func:`fluffy.kernel.redaction.redact`) before they are written, as everything else the
kernel records is.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import aiosqlite
import msgspec

from fluffy.errors import ConfigError, SessionNotFound
from fluffy.ipc.ai_types import Message, ToolCall
from fluffy.kernel.ai.token_estimate import estimate_tokens
from fluffy.kernel.ai.usage import USAGE_SCHEMA
from fluffy.kernel.audit.entry import now_ms
from fluffy.kernel.redaction import redact
from fluffy.kernel.workflow.store import open_state_db

SCHEMA: Final = (
    """
CREATE TABLE IF NOT EXISTS conversation (
    session_id TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT NOT NULL,
    message TEXT NOT NULL, created_at INTEGER NOT NULL, PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS conversation_archive (
    session_id TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT NOT NULL,
    message TEXT NOT NULL, created_at INTEGER NOT NULL, archived_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS conversation_meta (
    session_id TEXT PRIMARY KEY, title TEXT NOT NULL DEFAULT '',
    summary TEXT NOT NULL DEFAULT '', summarised_upto INTEGER NOT NULL DEFAULT 0,
    pins TEXT NOT NULL DEFAULT '[]', turns INTEGER NOT NULL DEFAULT 0,
    messages INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, archived_at INTEGER,
    touched INTEGER NOT NULL DEFAULT 0  -- a counter over all sessions: orders same-ms updates
);
"""
    + USAGE_SCHEMA
)  # the providers' token counts (fluffy.kernel.ai.usage)
_SELECT_META: Final = (
    "SELECT session_id, title, summary, summarised_upto, pins, turns, messages, created_at, "
    "updated_at, archived_at FROM conversation_meta "
)
TITLE_CHARS: Final = 60
ARCHIVE_AFTER_DAYS: Final = 30
DAY_MS: Final = 86_400_000
#: Sessions whose messages the store keeps in memory (the most recently loaded).
LOADED_SESSIONS: Final = 8
#: All pins together may take this many tokens (the context budget's ``pins`` part).
PINS_TOKENS: Final = 2000

_message_json = msgspec.json.Encoder().encode
_decode_message = msgspec.json.Decoder(Message).decode


class Pin(msgspec.Struct, frozen=True):
    id: int
    text: str
    created_at: int


_encode_pins = msgspec.json.Encoder().encode
_decode_pins = msgspec.json.Decoder(list[Pin]).decode


class ConversationMeta(msgspec.Struct, frozen=True):
    session_id: str
    title: str
    summary: str
    summarised_upto: int
    pins: list[Pin]
    turns: int
    messages: int
    created_at: int
    updated_at: int
    archived_at: int | None

    @property
    def archived(self) -> bool:
        return self.archived_at is not None


def title_of(text: str) -> str:
    """A session's title: its first user message on one line, at most 60 characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= TITLE_CHARS else flat[: TITLE_CHARS - 3].rstrip() + "..."


def _redacted(value: Any) -> Any:
    """``value`` (JSON-like) with every string redacted, keys included."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {_redacted(key): _redacted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_redacted(item) for item in value]
    return value


def _clean(message: Message) -> Message:
    """``message`` with known secret shapes redacted from its text and arguments."""
    calls = [
        ToolCall(
            id=call.id,
            name=call.name,
            arguments=_redacted(call.arguments),
            invalid_arguments=(
                None if call.invalid_arguments is None else redact(call.invalid_arguments)
            ),
        )
        for call in message.tool_calls
    ]
    return msgspec.structs.replace(message, content=redact(message.content), tool_calls=calls)


class ConversationStore:
    """Async access to the conversation tables (its own connection; WAL shares the file)."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db
        #: the messages of the sessions loaded lately, as stored (this store is the
        #: only writer of its tables: append extends them, any other change drops them)
        self._loaded: dict[str, list[Message]] = {}
        #: their meta rows, as last written or read (every write here replaces or drops
        #: them): a running session's context reads its meta every model round
        self._metas: dict[str, ConversationMeta] = {}
        self._writes = 0  # writes begun: a read that a write overtook is not kept

    @classmethod
    async def open(cls, state_dir: Path) -> ConversationStore:
        db = await open_state_db(state_dir, SCHEMA)
        # Commits reach the OS (a killed kernel loses none) without waiting for the disk:
        # the audit connection's next commit syncs the shared WAL, this one's frames
        # with it, and one precedes every model request (ADR-079).
        await db.execute("PRAGMA synchronous=NORMAL")
        return cls(db)

    async def close(self) -> None:
        await self.db.close()

    # -- messages -------------------------------------------------------------------------
    async def append(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        also: Sequence[tuple[str, tuple[Any, ...]]] = (),
    ) -> int:
        """Store ``messages`` after the session's last one; returns the message count.

        ``also``: statements of this connection's other tables to commit with them (a
        model round's usage: one transaction, one sync, instead of two)."""
        for message in messages:
            if not isinstance(message, Message):
                raise TypeError(
                    f"the conversation stores Message values only, not {type(message).__name__}"
                )
        cleaned = [_clean(message) for message in messages]
        encoded = [(clean.role, _message_json(clean).decode(), clean.content) for clean in cleaned]
        db = self.db
        self._writes += 1
        try:  # one trip to the connection's thread (each statement was one, ~0.1 ms each)
            count, rows, meta = await db._execute(  # type: ignore[no-untyped-call]
                lambda: _append_rows(db._conn, session_id, encoded, also, now_ms())
            )
        except BaseException:
            self._loaded.pop(session_id, None)
            self._metas.pop(session_id, None)
            raise
        self._keep_meta(meta)
        loaded = self._loaded.get(session_id)
        if loaded is not None and len(loaded) == count:
            loaded.extend(_decode_message(row[3]) for row in rows)
        else:
            self._loaded.pop(session_id, None)
        return int(count + len(rows))

    async def replace_calls(self, session_id: str, calls: Mapping[str, ToolCall]) -> bool:
        """Put ``calls`` in place of the calls with their ids in the session's latest
        assistant message that has them (a summary for arguments not to be kept)."""
        rows = await self.db.execute_fetchall(
            "SELECT seq, message FROM conversation WHERE session_id = ? AND role = 'assistant' "
            "ORDER BY seq DESC LIMIT 8",
            (session_id,),
        )
        for seq, raw in rows:
            message = _decode_message(raw)
            if not any(call.id in calls for call in message.tool_calls):
                continue
            changed = [calls.get(call.id, call) for call in message.tool_calls]
            clean = _clean(msgspec.structs.replace(message, tool_calls=changed))
            await self.db.execute(
                "UPDATE conversation SET message = ? WHERE session_id = ? AND seq = ?",
                (_message_json(clean).decode(), session_id, seq),
            )
            await self.db.commit()
            self._loaded.pop(session_id, None)
            return True
        return False

    async def load(self, session_id: str) -> list[Message]:
        """The session's messages, oldest first (archived ones too).

        Kept after the first load (a running session's context reads them every model
        round, and the list only grows): the same Message values come back each time."""
        loaded = self._loaded.get(session_id)
        if loaded is None:
            rows = await self.db.execute_fetchall(
                "SELECT seq, message FROM conversation WHERE session_id = ? UNION ALL "
                "SELECT seq, message FROM conversation_archive WHERE session_id = ? "
                "ORDER BY seq",
                (session_id, session_id),
            )
            loaded = [_decode_message(row[1]) for row in rows]
            while len(self._loaded) >= LOADED_SESSIONS:
                self._loaded.pop(next(iter(self._loaded)))
        self._loaded.pop(session_id, None)
        self._loaded[session_id] = loaded  # the most recent last
        return list(loaded)

    # -- meta -----------------------------------------------------------------------------
    async def meta(self, session_id: str) -> ConversationMeta | None:
        kept = self._metas.get(session_id)
        if kept is not None:
            return kept
        writes = self._writes
        rows = list(
            await self.db.execute_fetchall(
                _SELECT_META + "WHERE session_id = ?",
                (session_id,),
            )
        )
        if not rows:
            return None
        meta = _meta(rows[0])
        if writes == self._writes:  # no write began meanwhile (one may have committed)
            self._keep_meta(meta)
        return meta

    def _keep_meta(self, meta: ConversationMeta) -> None:
        self._metas.pop(meta.session_id, None)
        while len(self._metas) >= LOADED_SESSIONS:
            self._metas.pop(next(iter(self._metas)))
        self._metas[meta.session_id] = meta  # the most recent last

    async def _require(self, session_id: str) -> ConversationMeta:
        meta = await self.meta(session_id)
        if meta is None:
            raise SessionNotFound(
                f"session {session_id} has no conversation",
                why="the session exists but no conversation has been stored for it",
            )
        return meta

    async def list_sessions(
        self, limit: int = 20, *, include_archived: bool = False
    ) -> list[ConversationMeta]:
        """The most recently updated sessions first."""
        rows = await self.db.execute_fetchall(
            _SELECT_META + "WHERE (? OR archived_at IS NULL) "
            "ORDER BY updated_at DESC, touched DESC LIMIT ?",
            (include_archived, limit),
        )
        return [_meta(row) for row in rows]

    async def turns(self, session_id: str) -> int:
        meta = await self.meta(session_id)
        return meta.turns if meta else 0

    async def set_summary(self, session_id: str, summary: str, upto: int) -> None:
        """Store the summary that now covers the session's first ``upto`` messages."""
        meta = await self._require(session_id)
        if not meta.summarised_upto <= upto <= meta.messages:
            raise ValueError(
                f"summarised_upto {upto} is outside {meta.summarised_upto}..{meta.messages}"
            )
        self._writes += 1
        try:
            await self.db.execute(
                "UPDATE conversation_meta SET summary = ?, summarised_upto = ?, updated_at = ?, "
                "touched = (SELECT COALESCE(MAX(touched), 0) + 1 FROM conversation_meta) "
                "WHERE session_id = ?",
                (redact(summary), upto, now_ms(), session_id),
            )
            await self.db.commit()
        finally:  # dropped once written (a read meanwhile may have kept the old row)
            self._metas.pop(session_id, None)

    # -- pins -----------------------------------------------------------------------------
    async def pins(self, session_id: str) -> list[Pin]:
        meta = await self.meta(session_id)
        return meta.pins if meta else []

    async def add_pin(self, session_id: str, text: str) -> Pin:
        """Pin ``text`` (never summarised away); all pins share a 2,000-token budget."""
        text = redact(text.strip())
        if not text:
            raise ConfigError(
                "an empty pin was not added",
                fix="Pin some text: /pin TEXT.",
                why="a pin is text kept in the model's context, and this one was empty after "
                "redaction",
            )
        meta = await self._require(session_id)
        used = sum(estimate_tokens(pin.text) for pin in meta.pins)
        if used + estimate_tokens(text) > PINS_TOKENS:
            raise ConfigError(
                "the pin does not fit in the pinned context",
                why=(
                    f"pins share a {PINS_TOKENS}-token budget; {used} are used and this one "
                    f"needs {estimate_tokens(text)}"
                ),
                fix="Unpin something (/unpin ID) or pin a shorter excerpt.",
            )
        pin = Pin(id=max((p.id for p in meta.pins), default=0) + 1, text=text, created_at=now_ms())
        await self._set_pins(session_id, [*meta.pins, pin])
        return pin

    async def remove_pin(self, session_id: str, pin_id: int) -> bool:
        meta = await self._require(session_id)
        kept = [pin for pin in meta.pins if pin.id != pin_id]
        if len(kept) == len(meta.pins):
            return False
        await self._set_pins(session_id, kept)
        return True

    async def _set_pins(self, session_id: str, pins: list[Pin]) -> None:
        self._writes += 1
        try:
            await self.db.execute(
                "UPDATE conversation_meta SET pins = ?, updated_at = ?, "
                "touched = (SELECT COALESCE(MAX(touched), 0) + 1 FROM conversation_meta) "
                "WHERE session_id = ?",
                (_encode_pins(pins).decode(), now_ms(), session_id),
            )
            await self.db.commit()
        finally:  # dropped once written (a read meanwhile may have kept the old row)
            self._metas.pop(session_id, None)

    # -- retention ------------------------------------------------------------------------
    async def prune(self, now: int | None = None, *, days: int = ARCHIVE_AFTER_DAYS) -> list[str]:
        """Archive the sessions not updated for ``days`` (default 30); their ids."""
        now = now_ms() if now is None else now
        cutoff = now - days * DAY_MS
        rows = await self.db.execute_fetchall(
            "SELECT session_id FROM conversation_meta WHERE archived_at IS NULL "
            "AND updated_at < ? ORDER BY session_id",
            (cutoff,),
        )
        ids = [str(row[0]) for row in rows]
        self._writes += 1
        try:
            for session_id in ids:
                await self.db.execute(
                    "INSERT INTO conversation_archive SELECT session_id, seq, role, message, "
                    "created_at, ? FROM conversation WHERE session_id = ?",
                    (now, session_id),
                )
                await self.db.execute(
                    "DELETE FROM conversation WHERE session_id = ?", (session_id,)
                )
                await self.db.execute(
                    "UPDATE conversation_meta SET archived_at = ? WHERE session_id = ?",
                    (now, session_id),
                )
                self._loaded.pop(session_id, None)
            await self.db.commit()
        except BaseException:
            await self.db.rollback()
            raise
        finally:
            for session_id in ids:
                self._metas.pop(session_id, None)
        return ids


def _append_rows(
    conn: sqlite3.Connection,
    session_id: str,
    encoded: Sequence[tuple[str, str, str]],
    also: Sequence[tuple[str, tuple[Any, ...]]],
    now: int,
) -> tuple[int, list[tuple[Any, ...]], ConversationMeta]:
    """On the connection's thread: ``encoded`` (role, stored JSON, content) after the
    session's last message, its meta and ``also`` in one transaction; (the count
    before, the rows, the meta as committed)."""
    try:
        found = conn.execute(_SELECT_META + "WHERE session_id = ?", (session_id,)).fetchone()
        meta = _meta(found) if found is not None else None
        if meta is not None and meta.archived:  # being continued: brought back first
            conn.execute(
                "INSERT INTO conversation SELECT session_id, seq, role, message, created_at "
                "FROM conversation_archive WHERE session_id = ?",
                (session_id,),
            )
            conn.execute("DELETE FROM conversation_archive WHERE session_id = ?", (session_id,))
            conn.execute(
                "UPDATE conversation_meta SET archived_at = NULL WHERE session_id = ?",
                (session_id,),
            )
        count = meta.messages if meta else 0
        title = meta.title if meta else ""
        turns = meta.turns if meta else 0
        rows: list[tuple[Any, ...]] = []
        for offset, (role, text, content) in enumerate(encoded):
            rows.append((session_id, count + offset, role, text, now))
            if role == "user":
                turns += 1
                title = title or title_of(content)
        conn.executemany("INSERT INTO conversation VALUES (?, ?, ?, ?, ?)", rows)
        conn.execute(
            "INSERT INTO conversation_meta (session_id, title, turns, messages, created_at, "
            "updated_at, touched) VALUES (?, ?, ?, ?, ?, ?, "
            "(SELECT COALESCE(MAX(touched), 0) + 1 FROM conversation_meta)) "
            "ON CONFLICT(session_id) DO UPDATE SET title = excluded.title, "
            "turns = excluded.turns, messages = excluded.messages, "
            "updated_at = excluded.updated_at, touched = excluded.touched",
            (session_id, title, turns, count + len(rows), now, now),
        )
        for sql, parameters in also:
            conn.execute(sql, parameters)
        written = conn.execute(_SELECT_META + "WHERE session_id = ?", (session_id,)).fetchone()
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return count, rows, _meta(written)


def _meta(row: Any) -> ConversationMeta:
    return ConversationMeta(
        session_id=str(row[0]),
        title=str(row[1]),
        summary=str(row[2]),
        summarised_upto=int(row[3]),
        pins=_decode_pins(row[4]),
        turns=int(row[5]),
        messages=int(row[6]),
        created_at=int(row[7]),
        updated_at=int(row[8]),
        archived_at=None if row[9] is None else int(row[9]),
    )
