"""verify() on files a reviewer of the stored-whole layout (ADR-027) took apart.

Each case is a change someone with write access to the state folder can make; each
must be found (or reported as unreadable), never raise and never stop the kernel.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import msgspec
import pytest

from fluffy.kernel.audit import ranges
from fluffy.kernel.audit.entry import _BASE, Event, _encode
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.recovery import check_database
from fluffy.kernel.audit.storage import archives
from fluffy.kernel.audit.store import HEAD_NAME, HEAD_SIZE, SELECT_ROWS, db_path, read_head
from fluffy.kernel.audit.verify import verify

DAY_MS = 86_400_000


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        self.now += 1
        return self.now


async def _log(state: Path, clock: Clock, count: int, break_at: int | None = None) -> None:
    log = await AuditLog.open(state, clock=clock, flush_interval_s=0.05)
    if log.empty:
        await log.record(Event("kernel_start", input_summary="kernel started"))
    for i in range(count):
        if i == break_at:
            await log.record(Event("audit_chain_break", metadata={"outcome": "recovered"}))
        else:
            await log.record(Event("policy_update", input_summary=f"rule {i}"))
    await log.close()


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    asyncio.run(_log(tmp_path / "state", Clock(20_000 * DAY_MS + DAY_MS // 2), 60, 30))
    return tmp_path / "state"


@pytest.mark.parametrize(
    "record",
    [
        {"chain_id": "c", "seq": 2**63, "hash": "ab"},
        {"chain_id": "c", "seq": -(10**30), "hash": "ab"},
        {"chain_id": "c", "seq": True, "hash": "ab"},
        "[" * 100_000,  # nested past the parser's recursion limit
    ],
    ids=["too-big", "too-small", "bool", "deep"],
)
def test_a_garbled_checkpoint_is_a_warning_not_a_crash(state: Path, record: object) -> None:
    text = record if isinstance(record, str) else json.dumps(record)
    (state / HEAD_NAME).write_text(text[:HEAD_SIZE].ljust(HEAD_SIZE))
    with pytest.raises(ValueError):
        read_head(state / HEAD_NAME)
    report = verify(state)
    assert report.ok and report.checkpoint is None and report.warnings, report
    assert check_database(state).outcome == "ok"


def test_an_anchor_without_its_hash_is_reported(state: Path) -> None:
    with closing(sqlite3.connect(db_path(state))) as conn:
        conn.execute("INSERT INTO audit_meta VALUES ('anchor_seq', '0')")
        conn.commit()
    report = verify(state)
    assert not report.ok and report.problem is not None
    assert "anchor_hash" in report.problem.detail
    assert check_database(state).outcome == "tampered"


def test_history_rewritten_in_an_archive_is_caught_by_the_checkpoint(tmp_path: Path) -> None:
    """The checkpointed entry was rotated out of the active file (the writer's timer ran
    after midnight with nothing new): it is still compared, in its archive."""
    state, clock = tmp_path / "state", Clock(20_000 * DAY_MS + DAY_MS - 10_000)
    asyncio.run(_log(state, clock, 50))
    clock.now = 20_001 * DAY_MS + 1_000

    async def idle() -> None:
        log = await AuditLog.open(state, clock=clock, flush_interval_s=0.05)
        await asyncio.sleep(0.3)  # the timer runs the writer's upkeep: rotation
        await log.close()

    asyncio.run(idle())
    (archive,) = archives(state)
    assert verify(state).ok
    with closing(sqlite3.connect(archive.path)) as conn:
        prev = None
        for seq, _, _, entry, _ in conn.execute(SELECT_ROWS + " ORDER BY seq").fetchall():
            fields = msgspec.json.decode(entry)
            if seq == 10:
                fields[14] = "forged"
            elif prev is not None:
                fields[2] = prev
            if seq >= 10:
                encoded = _encode(fields)
                digest = _BASE.copy()
                digest.update(encoded)
                prev = digest.hexdigest()
                conn.execute(
                    "UPDATE audit_log SET entry = ?, hash = ? WHERE seq = ?", (encoded, prev, seq)
                )
        conn.execute("UPDATE audit_meta SET value = ? WHERE key = 'head_hash'", (prev,))
        conn.commit()
    with closing(sqlite3.connect(db_path(state))) as conn:
        conn.execute("UPDATE audit_meta SET value = ? WHERE key = 'anchor_hash'", (prev,))
        conn.commit()
    report = verify(state)
    assert not report.ok and report.problem is not None
    assert report.problem.kind == "rolled_back", report.problem


def test_a_rebuilt_index_cannot_hide_a_chain_break_from_the_fast_check(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast check finds special entries itself, not through the partial index."""
    monkeypatch.setattr(ranges, "PARALLEL_MIN_ROWS", 1)
    monkeypatch.setattr(ranges, "CHUNK_ROWS", 16)
    monkeypatch.setattr(ranges, "workers", lambda: 2)
    before = verify(state)
    assert before.ok and [b["outcome"] for b in before.breaks] == ["recovered"]
    with closing(sqlite3.connect(db_path(state))) as conn:
        (schema,) = conn.execute(
            "SELECT sql FROM sqlite_schema WHERE name = 'audit_log_special'"
        ).fetchone()
        conn.executescript(
            "DROP INDEX audit_log_special; "
            "CREATE INDEX audit_log_special ON audit_log (seq) WHERE event_type = 'none'; "
        )
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_schema SET sql = ? WHERE name = 'audit_log_special'", (schema,))
        conn.commit()
    after = verify(state)
    assert after.breaks == before.breaks


def test_a_current_table_with_a_renamed_column_is_left_in_place(tmp_path: Path) -> None:
    state = tmp_path / "state"
    asyncio.run(_log(state, Clock(20_000 * DAY_MS + DAY_MS // 2), 5))
    with closing(sqlite3.connect(db_path(state))) as conn:
        conn.execute("ALTER TABLE audit_log RENAME COLUMN entry TO body")
        conn.commit()
    copy = tmp_path / "copy.db"
    shutil.copyfile(db_path(state), copy)
    check = check_database(state)
    assert check.outcome == "tampered" and "body" in check.detail, check.detail
    assert db_path(state).read_bytes() == copy.read_bytes()  # not converted, not moved
