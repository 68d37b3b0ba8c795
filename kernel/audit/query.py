"""Reading the audit log: filters for ``fluffy audit log`` and JSONL export.

Readers use their own read-only connections (WAL: they never block the writer) and
walk the archives and then the active database, oldest entry first.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import AuditQueryError
from fluffy.kernel.audit.entry import DECISIONS, EVENT_TYPES, now_ms, row_to_dict
from fluffy.kernel.audit.storage import archives
from fluffy.kernel.audit.store import SELECT_ROWS, connect_ro, db_path, field_sql, unpack

_RELATIVE = re.compile(r"(\d+)(s|m|h|d)")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_since(value: str, *, now: int | None = None) -> int:
    """ms since the epoch for "30m", "2h", "7d" (ago) or an ISO 8601 date/time (UTC if naive)."""
    match = _RELATIVE.fullmatch(value.strip())
    if match:
        return (now if now is not None else now_ms()) - int(match[1]) * _UNIT_MS[match[2]]
    try:
        moment = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise AuditQueryError(
            f"--since {value!r} is neither a duration nor a date",
            fix='Use a duration ago ("30m", "2h", "7d") or an ISO date ("2026-11-22T10:00").',
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class Filters:
    since_ms: int | None = None
    event_type: str | None = None
    session: str | None = None
    decision: str | None = None
    limit: int | None = None
    seq: int | None = None  # one entry (the web view's entry page)
    tool: str | None = None
    before: int | None = None  # entries older than this seq (a page further back)

    def __post_init__(self) -> None:
        if self.event_type is not None and self.event_type not in EVENT_TYPES:
            raise AuditQueryError(
                f"unknown event type {self.event_type!r}",
                fix=f"Use one of: {', '.join(sorted(EVENT_TYPES))}.",
            )
        if self.decision is not None and self.decision not in DECISIONS:
            raise AuditQueryError(
                f"unknown decision {self.decision!r}", fix=f"Use one of: {', '.join(DECISIONS)}."
            )
        if self.limit is not None and self.limit < 1:
            raise AuditQueryError("--limit must be 1 or more")

    def where(self) -> tuple[str, list[Any]]:
        clauses, params = [], []
        for column, value in (
            ("timestamp >= ?", self.since_ms),
            ("event_type = ?", self.event_type),
            (field_sql("session_id") + " = ?", self.session),
            (field_sql("policy_decision") + " = ?", self.decision),
            ("seq = ?", self.seq),
            # a tool call is recorded as the syscall it is (the tool's name as syscall_type)
            (f"? IN ({field_sql('syscall_type')}, {field_sql('tool_name')})", self.tool),
            ("seq < ?", self.before),
        ):
            if value is not None:
                clauses.append(column)
                params.append(value)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def entries(state_dir: Path, filters: Filters = Filters()) -> Iterator[dict[str, Any]]:
    """Matching entries, oldest first (``limit`` keeps the newest N)."""
    files = [a.path for a in archives(state_dir)]
    if db_path(state_dir).exists():
        files.append(db_path(state_dir))
    where, params = filters.where()
    if filters.limit is not None:
        yield from _newest(files, where, params, filters.limit)
        return
    last = None  # an interrupted rotation leaves archived rows in the active file too
    for file in files:
        conn = connect_ro(file)
        try:
            for stored in conn.execute(SELECT_ROWS + where + " ORDER BY seq", params):
                if last is None or stored[0] > last:
                    last = stored[0]
                    row = unpack(stored)
                    yield row_to_dict(row[:-1], row[-1])
        finally:
            conn.close()


def _newest(
    files: list[Path], where: str, params: list[Any], limit: int
) -> Iterator[dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for file in reversed(files):
        conn = connect_ro(file)
        try:
            query = SELECT_ROWS + where + " ORDER BY seq DESC LIMIT ?"
            rows = conn.execute(query, [*params, limit]).fetchall()
        finally:
            conn.close()
        for stored in rows:  # an interrupted rotation leaves archived rows in two files
            if stored[0] not in found:
                row = unpack(stored)
                found[stored[0]] = row_to_dict(row[:-1], row[-1])
        if len(found) >= limit:
            break
    yield from (found[seq] for seq in sorted(found)[-limit:])


def export_jsonl(state_dir: Path, out: Any, filters: Filters = Filters()) -> int:
    """Write one JSON object per line (every field, hash included); returns the count."""
    encoder = msgspec.json.Encoder()
    count = 0
    for entry in entries(state_dir, filters):
        out.write(encoder.encode(entry).decode() + "\n")
        count += 1
    return count
