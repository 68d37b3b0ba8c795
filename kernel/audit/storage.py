"""Retention, daily rotation and size limits of the audit log (design: Retention Policy).

Rotation moves the entries of past days (UTC) into ``audit-archive/audit-<day>-<first>-
<last>.db``, a database of the same layout, and records in the active database's
``audit_meta`` the anchor (seq, hash) of the last archived entry, so the chain
continues across files and every archive stays verifiable.  The move is crash-safe:
the archive is written under a temporary name, fsynced and renamed before the rows
leave the active file; an interrupted rotation is finished at the next start.

Size: above 80 % of ``max_size`` an ``audit_storage_warning``, above 95 %
``audit_storage_critical``, above 100 % the oldest archive is deleted and
``audit_archive_deleted`` records what it held (its last seq and hash let the verifier
accept the chain's new start).  Archives older than ``retention_days`` go the same way.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import aiosqlite
import msgspec
from pydantic import BaseModel, ConfigDict, field_validator

from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.store import ARCHIVE_DIR, DB_NAME, connect_ro, fetch_meta, read_meta
from fluffy.units import parse_size

DAY_MS = 86_400_000
_ARCHIVE = re.compile(r"audit-(\d{8})-(\d{12})-(\d{12})\.db")


class StorageSettings(BaseModel):
    """policy.yaml / config ``audit:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retention_days: int = 90
    max_size: int = 1024**3
    rotation: Literal["daily", "none"] = "daily"
    export_format: Literal["jsonl"] = "jsonl"

    @field_validator("max_size", mode="before")
    @classmethod
    def _size(cls, value: object) -> int:
        if isinstance(value, str | int) and not isinstance(value, bool):
            return parse_size(value)
        raise ValueError("max_size is a size like '1GiB'")


class Archive(msgspec.Struct, frozen=True):
    path: Path
    day: str
    first_seq: int
    last_seq: int


def archives(state_dir: Path) -> list[Archive]:
    """The archive files, oldest chain segment first."""
    folder = state_dir / ARCHIVE_DIR
    found = []
    if folder.is_dir():
        for path in folder.iterdir():
            match = _ARCHIVE.fullmatch(path.name)
            if match:
                found.append(Archive(path, match[1], int(match[2]), int(match[3])))
    return sorted(found, key=lambda a: a.first_seq)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def day_start(ms: int) -> int:
    return ms - ms % DAY_MS


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def audit_schema(prefix: str = "") -> str:
    """store.AUDIT_SCHEMA with every table and index in schema ``prefix`` (e.g. "arc.")."""
    from fluffy.kernel.audit.store import AUDIT_SCHEMA

    return re.sub(r"IF NOT EXISTS (\w+)", rf"IF NOT EXISTS {prefix}\1", AUDIT_SCHEMA)


class Storage:
    def __init__(
        self, state_dir: Path, settings: StorageSettings, clock: Callable[[], int]
    ) -> None:
        self.state_dir = state_dir
        self.settings = settings
        self.clock = clock
        self._oldest: int | None = None
        self._level = 0  # 0 fine, 1 warning, 2 critical (events only when it rises)
        self.doomed: list[Path] = []

    def unlink_doomed(self) -> None:
        """Delete the archives whose deletion the log has now durably recorded."""
        for path in self.doomed:
            path.unlink(missing_ok=True)
        if self.doomed:
            _fsync_dir(self.doomed[0].parent)
        self.doomed.clear()

    def saw(self, timestamp: int) -> None:
        if self._oldest is None:
            self._oldest = timestamp

    async def finish_rotation(self, db: aiosqlite.Connection) -> None:
        """Complete a rotation a crash interrupted; learn the oldest active entry."""
        folder = self.state_dir / ARCHIVE_DIR
        if folder.is_dir():
            for stray in folder.glob("*.tmp"):
                stray.unlink(missing_ok=True)
        done = archives(self.state_dir)
        if done:
            last = done[-1]
            rows = list(
                await db.execute_fetchall(
                    "SELECT hash FROM audit_log WHERE seq = ?", (last.last_seq,)
                )
            )
            if rows:  # the archive was renamed but the rows never left the active file
                await self._drop_archived(db, last.last_seq, str(rows[0][0]))
        rows = list(await db.execute_fetchall("SELECT MIN(timestamp) FROM audit_log"))
        self._oldest = rows[0][0] if rows and rows[0][0] is not None else None

    async def _drop_archived(self, db: aiosqlite.Connection, last_seq: int, last_hash: str) -> None:
        await db.execute("DELETE FROM audit_log WHERE seq <= ?", (last_seq,))
        await db.execute(
            "INSERT OR REPLACE INTO audit_meta VALUES ('anchor_seq', ?), ('anchor_hash', ?)",
            (str(last_seq), last_hash),
        )
        await db.commit()

    def rotation_due(self) -> int | None:
        """Today's midnight when the file holds entries of an earlier day (no SQL)."""
        if self.settings.rotation != "daily" or self._oldest is None:
            return None
        midnight = day_start(self.clock())
        return midnight if self._oldest < midnight else None

    async def maybe_rotate(
        self, db: aiosqlite.Connection, chain_id: str, midnight: int
    ) -> list[Event]:
        """Archive the entries before ``midnight`` (from :meth:`rotation_due`)."""
        rows = list(
            await db.execute_fetchall(
                "SELECT seq, hash, timestamp FROM audit_log WHERE seq = "
                "(SELECT MAX(seq) FROM audit_log WHERE timestamp < ?)",
                (midnight,),
            )
        )
        if not rows:
            self._oldest = None
            return []
        last_seq, last_hash, last_ts = int(rows[0][0]), str(rows[0][1]), int(rows[0][2])
        first = next(iter(await db.execute_fetchall("SELECT MIN(seq) FROM audit_log")))[0]
        day = dt.datetime.fromtimestamp(last_ts / 1000, dt.UTC).strftime("%Y%m%d")
        folder = self.state_dir / ARCHIVE_DIR
        folder.mkdir(mode=0o700, exist_ok=True)
        final = folder / f"audit-{day}-{int(first):012d}-{last_seq:012d}.db"
        tmp = final.with_name(final.name + ".tmp")
        tmp.unlink(missing_ok=True)
        meta = await fetch_meta(db)
        await db.execute("ATTACH DATABASE ? AS arc", (str(tmp),))
        try:
            await db.executescript(audit_schema("arc."))
            await db.execute(  # the archive's own head: its last entry, marked (ADR-099)
                "INSERT INTO arc.audit_log SELECT seq, timestamp, event_type, entry, hash, "
                "seq = ?1 FROM main.audit_log WHERE seq <= ?1",
                (last_seq,),
            )
            carried = {"chain_id": chain_id, "head_seq": str(last_seq), "head_hash": last_hash}
            for key in ("anchor_seq", "anchor_hash"):
                if key in meta:
                    carried[key] = meta[key]
            await db.executemany(
                "INSERT OR REPLACE INTO arc.audit_meta VALUES (?, ?)", carried.items()
            )
            await db.commit()
        finally:
            await db.execute("DETACH DATABASE arc")
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.rename(final)
        _fsync_dir(folder)
        await self._drop_archived(db, last_seq, last_hash)
        rows = list(await db.execute_fetchall("SELECT MIN(timestamp) FROM audit_log"))
        self._oldest = rows[0][0] if rows and rows[0][0] is not None else None
        return []

    # -- size and retention -----------------------------------------------------------
    def total_size(self) -> int:
        total = 0
        for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                total += (self.state_dir / name).stat().st_size
        for archive in archives(self.state_dir):
            with contextlib.suppress(FileNotFoundError):
                total += archive.path.stat().st_size
        return total

    def _delete(self, archive: Archive, reason: str) -> Event:
        last_hash = ""
        with contextlib.suppress(sqlite3.Error, FileNotFoundError):
            conn = connect_ro(archive.path)
            try:
                last_hash = read_meta(conn).get("head_hash", "")
            finally:
                conn.close()
        self.doomed.append(archive.path)  # unlinked once this event is durably committed
        return Event(
            "audit_archive_deleted",
            input_summary=f"deleted audit archive {archive.path.name} ({reason})",
            metadata={
                "archive": archive.path.name,
                "first_seq": str(archive.first_seq),
                "last_seq": str(archive.last_seq),
                "last_hash": last_hash,
                "reason": reason,
            },
        )

    def check_size(self) -> list[Event]:
        """Storage events; archives to delete go to :attr:`doomed` (see :meth:`unlink_doomed`)."""
        events: list[Event] = []
        cutoff = self.clock() - self.settings.retention_days * DAY_MS
        remaining = []
        for archive in archives(self.state_dir):
            day = dt.datetime.strptime(archive.day, "%Y%m%d").replace(tzinfo=dt.UTC)
            if int(day.timestamp() * 1000) + DAY_MS <= cutoff:
                events.append(
                    self._delete(archive, f"older than {self.settings.retention_days} days")
                )
            else:
                remaining.append(archive)
        limit = self.settings.max_size
        size = self.total_size() - sum(_size(path) for path in self.doomed)
        while size > limit and remaining:
            oldest = remaining.pop(0)
            events.append(self._delete(oldest, "audit storage above max_size"))
            size -= _size(oldest.path)
        ratio = size / limit if limit else 1.0
        level = 2 if ratio > 0.95 else 1 if ratio > 0.80 else 0
        if level > self._level:
            kind = "audit_storage_critical" if level == 2 else "audit_storage_warning"
            events.append(
                Event(
                    kind,
                    input_summary=f"audit storage at {ratio:.0%} of {limit} bytes",
                    metadata={"size": str(size), "max_size": str(limit)},
                )
            )
        self._level = level
        return events
