"""Rotation, retention, size limits and WAL checkpoints of the audit log (injected clock).

The log is driven through :class:`AuditLog` with a clock the test moves from day to day.
Storage rules run in the writer between commits, so "the writer has acted" means: one
``flush`` (its commit) and a second one (the maintenance after that commit has finished
and whatever it recorded is committed).
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import AuditUnavailable
from fluffy.kernel.audit import log as audit_log_module
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import entries
from fluffy.kernel.audit.recovery import check_database
from fluffy.kernel.audit.storage import DAY_MS, Storage, StorageSettings, archives, day_start
from fluffy.kernel.audit.store import ARCHIVE_DIR, Head, db_path
from fluffy.kernel.audit.verify import verify
from tests.audit_support import change_entry, entry_fields

DAY1 = 20_000 * DAY_MS + DAY_MS // 2  # 2024-10-04 12:00 UTC
PER_DAY = 5


class Clock:
    """A settable clock in ms that moves on by 1 ms at every reading."""

    def __init__(self, now: int = DAY1) -> None:
        self.now = now

    def __call__(self) -> int:
        self.now += 1
        return self.now

    def next_day(self) -> None:
        self.now += DAY_MS


async def settle(log: AuditLog) -> None:
    """Commit everything, then let the maintenance that follows the commit finish."""
    await log.flush()
    await log.flush()


async def write_day(log: AuditLog, day: int, count: int = PER_DAY) -> None:
    for i in range(count):
        log.record_nowait(Event("syscall", syscall_type="fs.read", input_summary=f"day {day} #{i}"))
    await log.record(Event("policy_update", input_summary=f"day {day} policy"))
    await settle(log)


async def three_days(state: Path, clock: Clock, **options: Any) -> AuditLog:
    """An open log with entries on day 1, 2 and 3 (the clock ends on day 3)."""
    log = await AuditLog.open(state, clock=clock, **options)
    await log.record(Event("kernel_start"))
    for day in (1, 2, 3):
        if day > 1:
            clock.next_day()
        await write_day(log, day)
    return log


def rows(path: Path) -> list[tuple[int, int, str]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT seq, timestamp, hash FROM audit_log ORDER BY seq").fetchall()


def meta(path: Path) -> dict[str, str]:
    with closing(sqlite3.connect(path)) as conn:
        return dict(conn.execute("SELECT key, value FROM audit_meta").fetchall())


def day_name(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y%m%d")


def logged(state: Path, event_type: str) -> list[dict[str, Any]]:
    return [e for e in entries(state) if e["event_type"] == event_type]


def _with_archives(state: Path) -> None:
    async def scenario() -> None:
        log = await three_days(state, Clock())
        await log.close()

    asyncio.run(scenario())


# -- rotation ---------------------------------------------------------------------------


def test_each_past_day_moves_into_an_archive_and_the_chain_spans_the_files(
    tmp_path: Path,
) -> None:
    clock = Clock()
    per_day = PER_DAY + 1

    async def scenario() -> Head:
        log = await three_days(tmp_path, clock)
        head = log.head
        await log.close()
        return head

    head = asyncio.run(scenario())
    found = archives(tmp_path)
    assert [a.day for a in found] == [day_name(DAY1), day_name(DAY1 + DAY_MS)]
    assert all(a.path.parent == tmp_path / ARCHIVE_DIR for a in found)
    # day 1 holds kernel_start + its entries, day 2 the next ones: contiguous, no overlap
    assert (found[0].first_seq, found[0].last_seq) == (1, 1 + per_day)
    assert (found[1].first_seq, found[1].last_seq) == (2 + per_day, 1 + 2 * per_day)
    for archive, day in zip(found, (DAY1, DAY1 + DAY_MS), strict=True):
        stored = rows(archive.path)
        assert [s for s, _, _ in stored] == list(range(archive.first_seq, archive.last_seq + 1))
        assert all(day_start(day) <= ts < day_start(day) + DAY_MS for _, ts, _ in stored)
    active = rows(db_path(tmp_path))
    today = day_start(clock.now)
    assert active and all(ts >= today for _, ts, _ in active)
    assert active[0][0] == found[1].last_seq + 1
    assert meta(db_path(tmp_path))["anchor_seq"] == str(found[1].last_seq)

    report = verify(tmp_path)
    assert report.ok, report.problem
    assert report.files == [found[0].path.name, found[1].path.name, "fluffy.db"]
    assert report.entries == head.seq == 1 + 3 * per_day
    assert report.head == head
    assert [e["id"] for e in entries(tmp_path)] == list(range(1, head.seq + 1))


def test_rotation_none_keeps_everything_in_the_active_database(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await three_days(tmp_path, Clock(), settings=StorageSettings(rotation="none"))
        await log.close()

    asyncio.run(scenario())
    assert archives(tmp_path) == []
    assert len(rows(db_path(tmp_path))) == 1 + 3 * (PER_DAY + 1)
    assert verify(tmp_path).ok


def test_a_log_reopened_on_a_later_day_rotates_without_new_entries(tmp_path: Path) -> None:
    clock = Clock()

    async def first() -> None:
        log = await AuditLog.open(tmp_path, clock=clock)
        await log.record(Event("kernel_start"))
        await write_day(log, 1)
        await log.close()

    async def second() -> None:
        clock.next_day()
        log = await AuditLog.open(tmp_path, clock=clock, flush_interval_s=0.05)
        await asyncio.sleep(0.3)  # idle: the writer's periodic wake-up does the rotation
        await log.close()

    asyncio.run(first())
    asyncio.run(second())
    assert [a.last_seq for a in archives(tmp_path)] == [PER_DAY + 2]
    assert rows(db_path(tmp_path)) == []
    report = verify(tmp_path)
    assert report.ok and report.last_seq == PER_DAY + 2
    archive = archives(tmp_path)[0].path
    with closing(sqlite3.connect(archive)) as conn:  # the archive's own head (ADR-099)
        marked = conn.execute("SELECT seq FROM audit_log WHERE head = 1").fetchall()
        conn.execute("DELETE FROM audit_log WHERE seq = ?", (PER_DAY + 2,))
        conn.execute("DELETE FROM audit_meta WHERE key IN ('head_seq', 'head_hash')")
        conn.commit()
    assert marked == [(PER_DAY + 2,)]
    problem = verify(tmp_path).problem
    assert problem is not None and (problem.kind, problem.seq) == ("truncated", PER_DAY + 2)


# -- retention --------------------------------------------------------------------------


def test_retention_deletes_old_archives_and_records_what_they_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_log_module, "WAL_CHECKPOINT_WRITES", 10)  # storage check soon
    clock = Clock()

    async def scenario() -> None:
        log = await three_days(tmp_path, clock, settings=StorageSettings(retention_days=1))
        await write_day(log, 3, count=20)
        await settle(log)
        await log.close()

    asyncio.run(scenario())
    found = archives(tmp_path)
    assert [a.day for a in found] == [day_name(DAY1 + DAY_MS)]  # day 1 gone, day 2 kept
    deleted = logged(tmp_path, "audit_archive_deleted")
    assert len(deleted) == 1
    record = deleted[0]["metadata"]
    day1 = 1 + PER_DAY + 1  # kernel_start + day 1's entries
    assert record["first_seq"] == "1"
    assert record["last_seq"] == str(day1)
    assert record["archive"] == f"audit-{day_name(DAY1)}-{1:012d}-{day1:012d}.db"
    assert "older than 1 days" in record["reason"]
    # the recorded hash is the hash of the last deleted entry: what the next archive names
    with closing(sqlite3.connect(found[0].path)) as conn:
        prev = entry_fields(conn, day1 + 1)[2]
    assert record["last_hash"] == prev

    report = verify(tmp_path)
    assert report.ok, report.problem
    assert report.first_seq == day1 + 1
    assert any(f"starts after entry {day1}" in w for w in report.warnings)


@pytest.mark.parametrize("which", ["oldest", "middle"])
def test_an_archive_deleted_by_hand_is_deleted(tmp_path: Path, which: str) -> None:
    """No record of the deletion.  Right entry: the first one that is gone (entry 1 for the
    oldest archive: the chain's start is unaccounted for; else the first of the middle
    archive: the chain jumps from the first archive to the active file)."""
    _with_archives(tmp_path)
    oldest, middle = archives(tmp_path)
    gone = oldest if which == "oldest" else middle
    gone.path.unlink()
    report = verify(tmp_path)
    assert not report.ok and report.problem is not None
    assert (report.problem.kind, report.problem.seq) == ("deleted", gone.first_seq)


def test_a_hand_deletion_after_a_recorded_one_names_the_first_unrecorded_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_log_module, "WAL_CHECKPOINT_WRITES", 10)
    clock = Clock()

    async def scenario() -> None:
        log = await three_days(tmp_path, clock, settings=StorageSettings(retention_days=1))
        await write_day(log, 3, count=20)
        await settle(log)
        await log.close()

    asyncio.run(scenario())
    (kept,) = archives(tmp_path)
    assert verify(tmp_path).ok
    kept.path.unlink()  # day 2 vanishes without a record; day 1's deletion is on record
    report = verify(tmp_path)
    assert not report.ok and report.problem is not None
    assert (report.problem.kind, report.problem.seq) == ("deleted", kept.first_seq)


# -- size limits ------------------------------------------------------------------------


def test_size_warning_then_critical_only_when_the_level_rises(tmp_path: Path) -> None:
    _with_archives(tmp_path)
    total = Storage(tmp_path, StorageSettings(), Clock()).total_size()
    storage = Storage(tmp_path, StorageSettings(max_size=int(total / 0.85)), Clock())
    (warning,) = storage.check_size()
    assert warning.event_type == "audit_storage_warning"
    assert warning.metadata == {"size": str(total), "max_size": str(int(total / 0.85))}
    assert storage.check_size() == []  # the same level again: nothing new

    critical = Storage(tmp_path, StorageSettings(max_size=int(total / 0.97)), Clock())
    assert [e.event_type for e in critical.check_size()] == ["audit_storage_critical"]
    assert critical.check_size() == []
    assert len(archives(tmp_path)) == 2  # below 100 %: nothing deleted

    fine = Storage(tmp_path, StorageSettings(max_size=total * 2), Clock())
    assert fine.check_size() == []


def test_above_max_size_the_oldest_archive_goes_first(tmp_path: Path) -> None:
    _with_archives(tmp_path)
    oldest, newer = archives(tmp_path)
    total = Storage(tmp_path, StorageSettings(), Clock()).total_size()
    left = total - oldest.path.stat().st_size
    limit = int(left / 0.97)  # above it now; at 97 % once the oldest archive is gone
    assert left < limit < total
    storage = Storage(tmp_path, StorageSettings(max_size=limit), Clock())
    events = storage.check_size()
    assert [e.event_type for e in events] == ["audit_archive_deleted", "audit_storage_critical"]
    assert events[0].metadata["archive"] == oldest.path.name
    assert events[0].metadata["reason"] == "audit storage above max_size"
    assert events[0].metadata["last_seq"] == str(oldest.last_seq)
    assert archives(tmp_path) == [oldest, newer]  # kept until its deletion is on record
    storage.unlink_doomed()
    assert archives(tmp_path) == [newer]


def test_a_tiny_max_size_through_the_writer_records_every_deletion_and_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_size runs after every WAL_CHECKPOINT_WRITES committed rows (1,000; 50 here)."""
    monkeypatch.setattr(audit_log_module, "WAL_CHECKPOINT_WRITES", 50)
    clock = Clock()

    async def scenario() -> None:
        log = await three_days(
            tmp_path, clock, settings=StorageSettings.model_validate({"max_size": "1KiB"})
        )
        assert len(archives(tmp_path)) == 2
        for i in range(60):
            log.record_nowait(Event("syscall", input_summary=f"filler {i}"))
        await settle(log)
        await settle(log)
        await log.close()

    asyncio.run(scenario())
    assert archives(tmp_path) == []
    deleted = logged(tmp_path, "audit_archive_deleted")
    assert [d["metadata"]["first_seq"] for d in deleted] == ["1", str(PER_DAY + 3)]
    assert len(logged(tmp_path, "audit_storage_critical")) == 1
    assert logged(tmp_path, "audit_storage_warning") == []  # straight to critical
    report = verify(tmp_path)
    assert report.ok, report.problem


# -- an interrupted rotation ------------------------------------------------------------


def _interrupt_last_rotation(state: Path) -> int:
    """Put the newest archive's rows back into the active file, as a crash between the
    archive's rename and the deletion of its rows leaves it.  Returns the entry count."""
    archive = archives(state)[-1]
    path = db_path(state)
    before = meta(path)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("ATTACH DATABASE ? AS arc", (str(archive.path),))
        conn.execute("BEGIN")
        conn.execute("INSERT INTO audit_log SELECT * FROM arc.audit_log")
        archived = dict(conn.execute("SELECT key, value FROM arc.audit_meta").fetchall())
        for key in ("head_seq", "head_hash"):  # the trigger moved the head back: undo
            conn.execute("UPDATE audit_meta SET value = ? WHERE key = ?", (before[key], key))
        for key in ("anchor_seq", "anchor_hash"):  # the anchor had not moved yet
            conn.execute("UPDATE audit_meta SET value = ? WHERE key = ?", (archived[key], key))
        conn.execute("COMMIT")
        conn.execute("DETACH DATABASE arc")
    return int(before["head_seq"])


def test_an_interrupted_rotation_is_finished_at_the_next_open_without_duplicates(
    tmp_path: Path,
) -> None:
    clock = Clock()

    async def scenario() -> None:
        log = await three_days(tmp_path, clock)
        await log.close()

    asyncio.run(scenario())
    total = _interrupt_last_rotation(tmp_path)
    last_archived = archives(tmp_path)[-1].last_seq
    assert rows(db_path(tmp_path))[0][0] < last_archived  # the rows are in both files

    # a crash is not tampering: verify passes (with a warning), readers see no duplicates
    report = verify(tmp_path)
    assert report.ok, report.problem
    assert any("interrupted" in w for w in report.warnings)
    assert [e["id"] for e in entries(tmp_path)] == list(range(1, total + 1))
    assert check_database(tmp_path).outcome == "ok"

    async def reopen() -> None:
        log = await AuditLog.open(tmp_path, clock=clock)
        await log.record(Event("kernel_start"))
        await log.close()

    asyncio.run(reopen())
    active = [s for s, _, _ in rows(db_path(tmp_path))]
    assert active == list(range(last_archived + 1, total + 2))
    assert meta(db_path(tmp_path))["anchor_seq"] == str(last_archived)
    report = verify(tmp_path)
    assert report.ok and report.warnings == []
    assert report.entries == total + 1
    assert [e["id"] for e in entries(tmp_path)] == list(range(1, total + 2))


def test_a_tampered_copy_left_by_an_interrupted_rotation_is_not_accepted(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = await three_days(tmp_path, Clock())
        await log.close()

    asyncio.run(scenario())
    _interrupt_last_rotation(tmp_path)
    first = archives(tmp_path)[-1].first_seq
    with closing(sqlite3.connect(db_path(tmp_path))) as conn:
        change_entry(conn, first, input_summary="edited")
        conn.commit()
    assert not verify(tmp_path).ok


def test_a_half_written_archive_is_removed_at_the_next_open(tmp_path: Path) -> None:
    _with_archives(tmp_path)
    stray = tmp_path / ARCHIVE_DIR / "audit-20991231-000000000001-000000000009.db.tmp"
    stray.write_bytes(b"half a database")

    async def reopen() -> None:
        log = await AuditLog.open(tmp_path, clock=Clock(DAY1 + 2 * DAY_MS + 1000))
        await log.close()

    asyncio.run(reopen())
    assert not stray.exists()
    assert verify(tmp_path).ok


@pytest.mark.parametrize("name", ["with#hash", "with?query", "with%41percent"])
def test_a_state_folder_with_uri_characters_is_read_where_it_is(tmp_path: Path, name: str) -> None:
    """Readers open the files as read-only SQLite URIs: the path must be quoted."""
    state = tmp_path / name
    _with_archives(state)
    report = verify(state)
    assert report.ok, report.problem
    assert report.entries == 1 + 3 * (PER_DAY + 1)
    assert len(list(entries(state))) == report.entries
    assert check_database(state).outcome == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing opened elsewhere


# -- WAL checkpoints --------------------------------------------------------------------


def _rows_in_main_file(state: Path, into: Path) -> int:
    """Rows a reader sees in the database file alone (without its WAL)."""
    shutil.copyfile(db_path(state), into)
    with closing(sqlite3.connect(into)) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()
    into.unlink()
    return int(count)


def test_a_wal_checkpoint_follows_every_thousand_writes(tmp_path: Path) -> None:
    """Counted in stats; afterwards the database file itself holds every committed row."""
    assert audit_log_module.WAL_CHECKPOINT_WRITES == 1000
    state = tmp_path / "state"
    alone = tmp_path / "alone.db"

    async def scenario() -> list[int]:
        log = await AuditLog.open(state, clock=Clock())
        counts = []
        await log.record(Event("kernel_start"))
        for i in range(998):
            log.record_nowait(Event("syscall", input_summary=f"#{i}"))
        await settle(log)
        counts.append(log.stats.wal_checkpoints)  # 999 rows: not yet
        log.record_nowait(Event("syscall", input_summary="the thousandth"))
        await settle(log)
        counts.append(log.stats.wal_checkpoints)
        assert _rows_in_main_file(state, alone) == 1000
        for i in range(1000):
            log.record_nowait(Event("syscall", input_summary=f"second #{i}"))
            if i % 100 == 0:
                await asyncio.sleep(0)
        await settle(log)
        counts.append(log.stats.wal_checkpoints)
        assert _rows_in_main_file(state, alone) == 2000
        assert log.stats.committed == 2000
        await log.close()
        return counts

    assert asyncio.run(scenario()) == [0, 1, 2]
    assert verify(state).ok


def test_settings_accept_sizes_and_refuse_nonsense() -> None:
    assert StorageSettings.model_validate({"max_size": "2MiB"}).max_size == 2 * 1024**2
    with pytest.raises(ValueError, match="max_size"):
        StorageSettings(max_size=True)
    with pytest.raises(ValueError, match="extra"):
        StorageSettings.model_validate({"max_sise": "1GiB"})


def test_a_storage_check_falling_due_at_close_records_its_deletions(tmp_path: Path) -> None:
    _with_archives(tmp_path)
    clock = Clock(DAY1 + 2 * DAY_MS + 1000)

    async def scenario() -> None:
        log = await AuditLog.open(tmp_path, clock=clock, settings=StorageSettings(max_size=1024))
        for i in range(audit_log_module.WAL_CHECKPOINT_WRITES):
            log.record_nowait(Event("syscall", input_summary=f"#{i}"))
        try:
            await log.close()  # the final commit reaches 1,000 writes: the check is due
        except AuditUnavailable:
            await log.db.close()  # the writer died: close by hand so the test run can end
            raise

    asyncio.run(scenario())
    assert len(logged(tmp_path, "audit_archive_deleted")) == 2
    assert verify(tmp_path).ok
