"""Start-up checks and recovery of the audit database (check_database, backups, open_audit).

A healthy file is used as it is; a tampered one is reported and left untouched; a corrupt
one is moved aside under ``corrupt/`` and replaced by what the sqlite3 CLI salvages, else
by the newest backup that verifies, else by a new database.  Whatever happened is
recorded (``audit_chain_break``) right after ``kernel_start`` by the kernel's start-up
(:func:`fluffy.kernel.serve.open_audit`), and ``verify`` lists it in ``report.breaks``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

from fluffy.kernel.audit.entry import Event, stored
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import entries
from fluffy.kernel.audit.recovery import (
    KEEP_BACKUPS,
    StartupCheck,
    backups,
    check_database,
    integrity_ok,
    take_backup,
)
from fluffy.kernel.audit.store import INSERT_SQL, Head, db_path, head_path, read_head
from fluffy.kernel.audit.verify import verify
from fluffy.kernel.serve import open_audit, start_audit, verify_chain
from tests.audit_support import change_entry, entry_fields, rewrite_in_earlier_layout

pytestmark = pytest.mark.anyio  # async tests run on asyncio (tests/conftest.py)
COUNT = 1200  # enough rows for a multi-page table and index


async def write(state: Path, count: int = COUNT, tag: str = "entry") -> Head:
    log = await AuditLog.open(state)
    if log.empty:
        await log.record(Event("kernel_start", input_summary="kernel started"))
    for i in range(count):
        log.record_nowait(
            Event("syscall", syscall_type="fs.read", input_summary=f"{tag} {i} " + "x" * 80)
        )
        if i % 100 == 0:
            await asyncio.sleep(0)
    await log.record(Event("policy_update", input_summary=f"{tag} done"))
    head = log.head
    await log.close()
    return head


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("recovery-template")
    anyio.run(write, state)  # once per module (the tests, sync or not, copy it)
    return state


@pytest.fixture()
def state(template: Path, tmp_path: Path) -> Path:
    target = tmp_path / "state"
    shutil.copytree(template, target)
    return target


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pages_of(path: Path, name: str, kind: str | None = None) -> list[int]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT pageno, pagetype FROM dbstat WHERE name = ? ORDER BY pageno", (name,)
        ).fetchall()
    return [page for page, pagetype in rows if kind is None or pagetype == kind]


def overwrite(path: Path, pages: list[int], fill: bytes | None = None) -> None:
    size = 4096
    with open(path, "r+b") as handle:
        for page in pages:
            handle.seek((page - 1) * size)
            handle.write(fill * size if fill is not None else os.urandom(size))


def corrupt_index(state: Path) -> bytes:
    """Garbage over every page of the timestamp index: the table's rows are intact."""
    path = db_path(state)
    overwrite(path, pages_of(path, "audit_log_time"))
    return path.read_bytes()


def corrupt_table(state: Path) -> bytes:
    """Garbage over three leaf pages in the middle of the table: rows are lost."""
    path = db_path(state)
    leaves = pages_of(path, "audit_log", "leaf")
    middle = len(leaves) // 2
    overwrite(path, leaves[middle : middle + 3], b"\xa5")
    return path.read_bytes()


def truncate_half(state: Path) -> bytes:
    path = db_path(state)
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    return path.read_bytes()


def moved_aside(state: Path) -> Path:
    (folder,) = (state / "corrupt").iterdir()
    return folder / "fluffy.db"


def no_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)  # recovery looks it up there


def needs_cli() -> None:
    if shutil.which("sqlite3") is None:
        pytest.skip("the sqlite3 command-line shell is not installed")


def the_break(check: StartupCheck) -> dict[str, str]:
    (event,) = check.events
    assert event.event_type == "audit_chain_break"
    assert event.sync  # recorded durably before the kernel serves anyone
    return dict(event.metadata)


# -- healthy, missing, tampered ---------------------------------------------------------


def test_a_healthy_database_is_ok_and_untouched(state: Path) -> None:
    before = digest(db_path(state))
    check = check_database(state)
    assert check.outcome == "ok"
    assert check.events == []
    assert check.report is not None and check.report.ok
    assert check.detail == f"{COUNT + 2} entries verified"
    assert digest(db_path(state)) == before
    assert not (state / "corrupt").exists()


def test_files_of_the_earlier_layout_are_converted_at_start_up_and_verify(state: Path) -> None:
    """The database and a backup written by an earlier fluffy (a column per field)."""
    backup = take_backup(state)
    assert backup is not None
    for path in (db_path(state), backup):
        with closing(sqlite3.connect(path)) as conn:
            rewrite_in_earlier_layout(conn)
    assert not verify(state).ok  # named, not misread
    check = check_database(state)
    assert check.outcome == "ok", check.detail
    assert (
        check.detail
        == f"{COUNT + 2} entries verified (2 file(s) converted from the earlier audit layout)"
    )
    assert verify(state).ok
    copy = state.parent / "copy"
    copy.mkdir()
    shutil.copyfile(backup, db_path(copy))
    assert verify(copy, checkpoint=False).ok
    assert check_database(state).detail == f"{COUNT + 2} entries verified"  # once


def test_an_earlier_layout_file_changed_before_conversion_is_tampered(state: Path) -> None:
    """A text that is not UTF-8 (the log never stores one) converts to a text that cannot
    match its hash: the kernel comes up and reports the entry."""
    with closing(sqlite3.connect(db_path(state))) as conn:
        rewrite_in_earlier_layout(conn)
        conn.execute("UPDATE audit_log SET input_summary = CAST(x'c328' AS TEXT) WHERE seq = 7")
        conn.commit()
    check = check_database(state)
    assert check.outcome == "tampered", check.detail
    assert "modified at entry 7" in check.detail


def test_an_earlier_layout_file_that_cannot_be_converted_does_not_stop_the_kernel(
    state: Path,
) -> None:
    """Here a leftover table holds the name the conversion needs: the file is moved aside
    as found, and a backup (converted too) takes its place."""
    backup = take_backup(state)
    assert backup is not None
    with closing(sqlite3.connect(backup)) as conn:
        rewrite_in_earlier_layout(conn)
    with closing(sqlite3.connect(db_path(state))) as conn:
        rewrite_in_earlier_layout(conn)
        conn.execute("CREATE TABLE audit_log_v1 (x)")
        conn.commit()
    before = digest(db_path(state))
    check = check_database(state)
    assert check.outcome in ("recovered", "restored_backup"), check.detail
    assert "cannot convert it from the earlier audit layout" in check.detail
    assert digest(moved_aside(state)) == before  # kept for forensics, untouched
    assert verify(state, checkpoint=False).ok


def test_no_database_and_no_checkpoint_is_a_fresh_start(tmp_path: Path) -> None:
    state = tmp_path / "new" / "state"
    check = check_database(state)
    assert (check.outcome, check.events) == ("ok", [])
    assert state.is_dir()


def test_a_missing_database_with_a_checkpoint_is_a_new_database_and_a_break(
    state: Path,
) -> None:
    checkpoint = read_head(head_path(state))
    db_path(state).unlink()
    check = check_database(state)
    assert check.outcome == "new_database"
    record = the_break(check)
    assert record["outcome"] == "new_database"
    assert record["kind"] == "truncated"
    assert "missing" in record["detail"]
    assert read_head(head_path(state)) == checkpoint  # the evidence is not overwritten


async def test_a_tampered_database_is_reported_and_left_as_it_is(state: Path) -> None:
    path = db_path(state)
    with closing(sqlite3.connect(path)) as conn:
        change_entry(conn, 500, input_summary="nothing to see")
        conn.commit()
    before = digest(path)
    check = check_database(state)
    assert check.outcome == "tampered"
    record = the_break(check)
    assert (record["outcome"], record["kind"], record["first_broken_id"]) == (
        "tampered",
        "modified",
        "500",
    )
    assert digest(path) == before
    assert not (state / "corrupt").exists()

    # the kernel comes up, records the break, and does not launder the chain
    await _startup_and_close(state)
    report = verify(state)
    assert not report.ok and report.problem is not None
    assert (report.problem.kind, report.problem.seq) == ("modified", 500)
    recorded = [e for e in entries(state) if e["event_type"] == "audit_chain_break"]
    assert [e["metadata"]["first_broken_id"] for e in recorded] == ["500"]


def _damage(state: Path, kind: str, spare: Path) -> None:
    """``state``'s log damaged the way ``kind`` names, its ``audit.head`` left as it is."""
    if kind == "modified":
        with closing(sqlite3.connect(db_path(state))) as conn:
            change_entry(conn, 500, input_summary="nothing to see")
            conn.commit()
    elif kind == "truncated":  # the newest entries deleted, the database's head kept
        with closing(sqlite3.connect(db_path(state))) as conn:
            conn.execute("DELETE FROM audit_log WHERE seq > (SELECT MAX(seq) - 20 FROM audit_log)")
            conn.commit()
    elif kind == "cut_off_after_a_crash":  # audit_meta's copy lags (ADR-099), the end cut
        with closing(sqlite3.connect(db_path(state))) as conn:
            conn.execute("UPDATE audit_meta SET value = '3' WHERE key = 'head_seq'")
            conn.execute("DELETE FROM audit_log WHERE seq > (SELECT MAX(seq) - 20 FROM audit_log)")
            conn.commit()
    elif kind == "appended":  # chained rows after the head, its mark left where it was
        with closing(sqlite3.connect(db_path(state))) as conn:
            seq, prev = conn.execute("SELECT seq, hash FROM audit_log ORDER BY seq DESC").fetchone()
            for n in (1, 2):
                fields = entry_fields(conn, seq)[:-1]
                fields[0], fields[2] = seq + n, prev
                row = stored(tuple(fields))
                conn.execute(INSERT_SQL, row)
                prev = row[-1]
            conn.commit()
    else:  # rolled back: an older copy of the database put back in place
        saved = {f.name: f.read_bytes() for f in state.glob("fluffy.db*")}
        anyio_run_write(state, spare)
        for f in state.glob("fluffy.db*"):
            f.unlink()
        for name, data in saved.items():
            (state / name).write_bytes(data)


def anyio_run_write(state: Path, spare: Path) -> None:
    """More entries written in a copy of the log, then moved over ``state`` (the sync
    helper of :func:`_damage`, which runs inside the test's loop)."""
    shutil.copytree(state, spare)
    anyio.from_thread.run(write, spare, 30, "later")  # type: ignore[arg-type]
    for f in spare.iterdir():
        shutil.copy2(f, state / f.name)


@pytest.mark.parametrize(
    "kind", ["modified", "truncated", "rolled_back", "cut_off_after_a_crash", "appended"]
)
async def test_the_check_after_the_kernel_listens_finds_what_the_start_found_before(
    state: Path, tmp_path: Path, kind: str
) -> None:
    """The start records kernel_start (rewriting audit.head and moving the database's
    own head) before the chain is verified: the check still judges the files as found.
    An end the file's own head doubts (cut off, rows after the mark) is verified at
    once, before kernel_start moves the mark."""
    await anyio.to_thread.run_sync(_damage, state, kind, tmp_path / "spare")
    twin = tmp_path / "twin"
    shutil.copytree(state, twin)
    await _startup_and_close(twin)  # verified before the log opened
    log, check = await start_audit(state)  # what the kernel's start does
    doubted = kind in ("truncated", "cut_off_after_a_crash", "appended")
    try:
        assert check.deferred is not doubted
        if check.deferred:
            assert not _breaks(state)
            await verify_chain(log, state, check.found)  # once it serves
    finally:
        await log.close()
    found = [(b["metadata"]["outcome"], b["metadata"]["kind"]) for b in _breaks(state)]
    assert found == [(b["metadata"]["outcome"], b["metadata"]["kind"]) for b in _breaks(twin)]
    expected = {"cut_off_after_a_crash": "truncated", "appended": "inserted"}.get(kind, kind)
    assert found and found[0] == ("tampered", expected)


async def test_a_healthy_log_s_late_check_finds_nothing_in_what_the_kernel_wrote(
    state: Path,
) -> None:
    log, check = await start_audit(state)
    try:
        for i in range(300):
            log.record_nowait(Event("syscall", syscall_type="fs.read", input_summary=f"{i}"))
        await log.record(Event("policy_update", input_summary="meanwhile"))
        await verify_chain(log, state, check.found)
    finally:
        await log.close()
    assert not _breaks(state) and verify(state).ok


async def test_a_late_check_that_cannot_read_the_log_is_recorded_and_holds_the_archives(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fluffy.kernel.serve as serve_module

    log, check = await start_audit(state)
    held: list[bool] = []

    def damaged(state_dir: Path, found: Any) -> Any:
        held.append(log.storage_held)  # no rotation or archive deletion under the check
        raise sqlite3.DatabaseError("file is not a database")

    monkeypatch.setattr(serve_module, "chain_check", damaged)
    try:
        await verify_chain(log, state, check.found)
        assert not log.storage_held
    finally:
        await log.close()
    assert held == [True]
    (recorded,) = _breaks(state)
    assert (
        "could not be verified: DatabaseError: file is not a database"
        in (recorded["metadata"]["detail"])
    )


def _breaks(state: Path) -> list[dict[str, Any]]:
    return [e for e in entries(state) if e["event_type"] == "audit_chain_break"]


# -- corrupt files ----------------------------------------------------------------------


def test_a_corrupt_index_is_salvaged_with_every_entry(state: Path) -> None:
    needs_cli()
    head = read_head(head_path(state))
    damaged = corrupt_index(state)
    assert not integrity_ok(db_path(state))[0]
    check = check_database(state)
    assert check.outcome == "recovered", check.detail
    assert moved_aside(state).read_bytes() == damaged  # kept for forensics
    assert integrity_ok(db_path(state))[0]
    report = verify(state)  # with the checkpoint: nothing was lost
    assert report.ok and report.head == head
    assert the_break(check)["outcome"] == "recovered"


@pytest.mark.parametrize("damage", [corrupt_table, truncate_half], ids=["pages", "half"])
async def test_an_unsalvageable_file_restores_the_newest_backup(state: Path, damage: Any) -> None:
    take_backup(state)
    first = await write(state, 50, "after the first backup")
    newest = take_backup(state)
    await write(state, 50, "lost")
    damaged = damage(state)
    check = check_database(state)
    assert check.outcome == "restored_backup", check.detail
    assert newest is not None and newest.name in check.detail
    assert moved_aside(state).read_bytes() == damaged
    report = verify(state, checkpoint=False)
    assert report.ok and report.head == first
    assert the_break(check)["outcome"] == "restored_backup"


async def test_a_backup_that_does_not_verify_is_skipped(state: Path) -> None:
    take_backup(state)
    older = read_head(head_path(state))
    await write(state, 20, "later")
    newest = take_backup(state)
    assert newest is not None
    with closing(sqlite3.connect(newest)) as conn:  # a healthy file, but tampered
        change_entry(conn, 3, input_summary="x")
        conn.commit()
    corrupt_table(state)
    check = check_database(state)
    assert check.outcome == "restored_backup"
    assert newest.name not in check.detail
    assert verify(state, checkpoint=False).head == older


def test_when_salvage_is_impossible_a_backup_is_restored(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backup = take_backup(state)
    assert backup is not None
    corrupt_index(state)  # salvageable, but there is no sqlite3 shell
    no_cli(monkeypatch)
    check = check_database(state)
    assert check.outcome == "restored_backup"
    assert backup.name in check.detail
    assert verify(state).ok


@pytest.mark.parametrize("damage", [corrupt_index, corrupt_table, truncate_half])
def test_with_no_salvage_and_no_backup_a_new_database_starts(
    state: Path, damage: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    damaged = damage(state)
    no_cli(monkeypatch)
    check = check_database(state)
    assert check.outcome == "new_database"
    assert check.report is None
    assert not db_path(state).exists()
    assert moved_aside(state).read_bytes() == damaged
    assert the_break(check)["outcome"] == "new_database"


def test_a_salvage_that_does_not_verify_is_not_used(state: Path) -> None:
    needs_cli()
    corrupt_table(state)  # whatever the shell saves has a hole in the chain
    check = check_database(state)
    assert check.outcome == "new_database", check.detail


# -- backups ----------------------------------------------------------------------------


async def test_backups_keep_the_newest_five(state: Path) -> None:
    made = []
    for i in range(KEEP_BACKUPS + 2):
        await write(state, 1, f"round {i}")
        backup = take_backup(state)
        assert backup is not None
        made.append(backup)
    assert sorted(backups(state)) == sorted(made[-KEEP_BACKUPS:])
    assert backups(state)[0] == made[-1]  # newest first
    newest = backups(state)[0]
    copy = state.parent / "copy"
    copy.mkdir()
    shutil.copyfile(newest, db_path(copy))
    report = verify(copy, checkpoint=False)
    assert report.ok and report.head == read_head(head_path(state))


def test_no_backup_without_a_database(tmp_path: Path) -> None:
    assert take_backup(tmp_path) is None
    assert backups(tmp_path) == []


# -- the kernel's start-up --------------------------------------------------------------


async def _startup_and_close(state: Path) -> Head:
    log = await open_audit(state)
    head = log.head
    await log.close()
    return head


async def _break_after_startup(state: Path, outcome: str) -> None:
    head = await _startup_and_close(state)
    report = verify(state)
    assert report.ok, report.problem
    assert report.head == head
    (recorded,) = report.breaks
    assert recorded["outcome"] == outcome
    assert recorded["id"] == head.seq  # right after this start's kernel_start
    start = [e for e in entries(state) if e["event_type"] == "kernel_start"][-1]
    assert start["id"] == head.seq - 1
    assert start["metadata"]["database"] == outcome


async def test_startup_after_a_salvage_records_the_break_and_verifies(state: Path) -> None:
    needs_cli()
    corrupt_index(state)
    await _break_after_startup(state, "recovered")


async def test_startup_after_restoring_a_backup_records_the_break_and_verifies(state: Path) -> None:
    take_backup(state)
    await write(state, 30, "lost")
    corrupt_table(state)
    await _break_after_startup(state, "restored_backup")


async def test_startup_with_a_new_database_records_the_break_and_verifies(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truncate_half(state)
    no_cli(monkeypatch)
    await _break_after_startup(state, "new_database")


async def test_startup_with_a_missing_database_records_the_break_and_verifies(state: Path) -> None:
    db_path(state).unlink()
    await _break_after_startup(state, "new_database")


async def test_a_clean_startup_records_no_break(state: Path) -> None:
    head = await _startup_and_close(state)
    report = verify(state)
    assert report.ok and report.breaks == []
    assert report.head == head
    assert [e["metadata"]["database"] for e in entries(state) if e["id"] == head.seq] == ["ok"]
