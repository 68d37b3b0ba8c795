"""Where the audit writer commits (ADR-026), and what a failed commit does.

A batch somebody waits for, small and while commits are fast, is committed on the event
loop's thread; buffered rows, big batches and slow disks go to the connection's thread.
Either way the caller of a security event resumes only once its row is committed.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from fluffy.errors import AuditUnavailable
from fluffy.kernel.audit import log as log_module
from fluffy.kernel.audit import sqlwrites
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import INLINE_ROWS, AuditLog
from fluffy.kernel.audit.store import HEAD_SIZE, Head, HeadFile, db_path, read_head
from fluffy.kernel.audit.verify import verify


def _policy(n: int) -> Event:
    return Event("policy_update", caller="cli:operator", input_summary=f"revision {n}")


def _count(state: Path) -> int:
    with closing(sqlite3.connect(db_path(state))) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()
    return int(count)


@pytest.fixture()
def threads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(thread name, rows) of every commit the writer makes."""
    seen: list[tuple[str, int]] = []
    real: Callable[..., Any] = sqlwrites.write_batch

    def spy(conn: sqlite3.Connection, rows: list[Any], *args: Any) -> Any:
        seen.append((threading.current_thread().name, len(rows)))
        return real(conn, rows, *args)

    monkeypatch.setattr(sqlwrites, "write_batch", spy)
    return seen


LOOP = threading.main_thread().name


@pytest.fixture()
def budget(monkeypatch: pytest.MonkeyPatch) -> float:
    """A commit budget a loaded machine's commits stay under (the real one, 2 ms, is
    for a quiet disk): the tests check where commits go, not how fast the disk is."""
    monkeypatch.setattr(log_module, "INLINE_BUDGET_S", 0.25)
    return 0.25


def test_an_awaited_event_commits_on_the_loop_thread_and_is_on_disk_when_it_returns(
    tmp_path: Path, threads: list[tuple[str, int]], budget: float
) -> None:
    async def scenario() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        for n in range(5):
            await log.record(_policy(n))
            assert _count(tmp_path) == n + 2  # another connection reads it: committed
        assert log.stats.inline_commits == 6
        assert log.stats.commit_ms > 0
        await log.close()

    asyncio.run(scenario())
    assert threads[:6] == [(LOOP, 1)] * 6
    assert verify(tmp_path).ok


def test_buffered_rows_and_big_batches_commit_off_the_loop_thread(
    tmp_path: Path, threads: list[tuple[str, int]]
) -> None:
    async def scenario() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        for n in range(INLINE_ROWS + 1):  # more than a loop-thread commit may hold
            log.record_nowait(Event("syscall", input_summary=f"call {n}"))
        await log.flush()
        await log.close()

    asyncio.run(scenario())
    assert threads[0] == (LOOP, 1)
    later = threads[1:]
    assert sum(rows for _, rows in later) == INLINE_ROWS + 1
    assert all(name != LOOP for name, rows in later if rows), later
    assert verify(tmp_path).ok


def test_slow_commits_go_to_the_connection_thread_until_they_are_fast_again(
    tmp_path: Path, threads: list[tuple[str, int]], budget: float
) -> None:
    async def scenario() -> int:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        log.stats.commit_ms = 25 * budget * 1000  # as if the disk had stalled
        before = len(threads)
        await log.record(_policy(0))
        assert threads[before][0] != LOOP  # over budget: not on the loop's thread
        for n in range(1, 60):
            await log.record(_policy(n))
            if threads[-1][0] == LOOP:
                break
        await log.close()
        return n

    recovered_after = asyncio.run(scenario())
    assert recovered_after < 59, "fast commits never brought the loop-thread path back"
    assert verify(tmp_path).ok


def test_commit_pending_commits_off_the_loop_while_the_loop_runs_on(
    tmp_path: Path, threads: list[tuple[str, int]], budget: float
) -> None:
    """A small batch a flush would commit on the loop's thread goes to the connection's
    thread under ``commit_pending``: the loop runs other work while it syncs, and the
    rows are on disk when it returns.  With nothing buffered it returns at once."""

    async def scenario() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        for n in range(3):
            log.record_nowait(Event("syscall", input_summary=f"call {n}"))
        before, commits = len(threads), log.stats.commits
        pending = asyncio.ensure_future(log.commit_pending())
        ran = 0
        while not pending.done():  # the loop is free while the commit runs
            ran += 1
            await asyncio.sleep(0)
        await pending
        assert ran > 1 and _count(tmp_path) == 4
        assert [name != LOOP for name, _ in threads[before:]] == [True]
        assert log.stats.commits == commits + 1 and log.durable_head == log.head
        await log.commit_pending()  # nothing buffered: no commit, no wait
        assert log.stats.commits == commits + 1 and len(threads) == before + 1
        log.record_nowait(Event("syscall", input_summary="call 3"))
        await log.flush()  # the same batch size under flush: the loop's own thread
        assert threads[-1] == (LOOP, 1)
        await log.close()

    asyncio.run(scenario())
    assert verify(tmp_path).ok


def test_a_security_event_is_committed_by_its_caller_while_the_writer_is_idle(
    tmp_path: Path,
) -> None:
    """No task switch: ``record`` finishes at its first step, the row already durable."""

    async def scenario() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        await asyncio.sleep(0.01)  # the writer task waits for work
        log.stats.commit_ms = 0.0  # (a slow first commit on a loaded disk: not this test's)
        inline = log.stats.inline_commits
        passes: list[int] = []
        maintain = log._maintain

        async def counted() -> None:  # the writer ends each pass with its maintenance
            passes.append(1)
            await maintain()

        log._maintain = counted  # type: ignore[method-assign]
        step = log.record(_policy(1))
        with pytest.raises(StopIteration):
            step.send(None)  # done without being suspended once
        assert _count(tmp_path) == 2  # committed: another connection reads it
        assert log.durable_head.seq == 2 and log.stats.inline_commits == inline + 1
        await asyncio.sleep(0.05)  # (the writer's own timer: 0.5 s)
        assert passes == []  # the writer was not woken for it
        await log.close()

    asyncio.run(scenario())
    assert verify(tmp_path).ok


def _ticker() -> tuple[Callable[[], int], asyncio.Task[None]]:
    """Another task that counts how often the loop lets it run."""
    ticks = 0

    async def other_task() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    return (lambda: ticks), asyncio.create_task(other_task())


@pytest.fixture()
def slow_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every commit holds the loop at least 1 ms, and callers hold it 2.5 ms at most
    (a few commits in a row)."""
    real = sqlwrites.write_now

    def slow(*args: Any) -> Any:
        time.sleep(0.001)
        return real(*args)

    monkeypatch.setattr(sqlwrites, "write_now", slow)
    monkeypatch.setattr(log_module, "CALLER_HOLD_S", 0.0025)


def _with_log(tmp_path: Path, body: Callable[[AuditLog], Awaitable[None]], **opts: Any) -> None:
    """``body`` with an open log (its chain begun), then the log closed and verified."""

    async def scenario() -> None:
        log = await AuditLog.open(tmp_path, **opts)
        try:
            await log.record(Event("kernel_start"))
            await body(log)
        finally:  # (an open connection's thread would keep the process from ending)
            await log.close()

    asyncio.run(scenario())
    assert verify(tmp_path).ok


@pytest.mark.usefixtures("slow_commits")
def test_security_events_give_the_loop_back_once_they_held_it_for_the_budget(
    tmp_path: Path, budget: float
) -> None:
    """A caller committing for itself never suspends; once callers' commits have held
    the loop for CALLER_HOLD_S, the next caller lets other tasks run first, then still
    commits its event itself (no hand-off to the writer)."""

    async def body(log: AuditLog) -> None:
        ticks, ticker = _ticker()
        await asyncio.sleep(0.01)
        log.stats.commit_ms = 0.0
        before, inline = ticks(), log.stats.inline_commits
        for n in range(30):
            await log.record(_policy(n))
        ran = ticks() - before
        ticker.cancel()
        assert ran >= 6, ran  # at least once per 3 commits of >= 1 ms (hold: 2.5 ms)
        assert log.stats.inline_commits - inline == 30  # each by its caller

    _with_log(tmp_path, body)


def test_fast_security_events_hold_the_loop_by_time_not_by_count(
    tmp_path: Path, budget: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many commits a run makes, it gives nothing back before the hold is up."""
    monkeypatch.setattr(log_module, "CALLER_HOLD_S", 60.0)

    async def body(log: AuditLog) -> None:
        ticks, ticker = _ticker()
        await asyncio.sleep(0.01)
        log.stats.commit_ms = 0.0
        before = ticks()
        for n in range(50):
            await log.record(_policy(n))
        assert ticks() == before  # the loop ran nothing else meanwhile
        ticker.cancel()
        assert _count(tmp_path) == 51

    _with_log(tmp_path, body)


@pytest.mark.usefixtures("slow_commits")
def test_concurrent_security_events_share_their_commits(tmp_path: Path, budget: float) -> None:
    """Callers that come while another holds the loop add their rows and wait; the one
    that let the loop run commits them all at once, and does so again while they keep
    coming back (each still returns only once its own row is durable)."""

    async def body(log: AuditLog) -> None:
        await asyncio.sleep(0.01)
        log.stats.commit_ms = 0.0
        commits = log.stats.commits

        async def caller(first: int) -> None:
            for n in range(first, first + 20):
                seq = await log.record(_policy(n))
                assert log.durable_head.seq >= seq

        await asyncio.gather(*(caller(20 * c) for c in range(16)))
        made = log.stats.commits - commits
        assert made <= 320 // 8, made  # 16 callers: about one commit per round
        assert _count(tmp_path) == 321

    _with_log(tmp_path, body)


def test_a_caller_cancelled_while_it_gives_the_loop_back_leaves_its_event_to_the_writer(
    tmp_path: Path, budget: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its row is already in the chain: the writer commits it at once, not at the next
    flush interval (a minute here)."""
    monkeypatch.setattr(log_module, "CALLER_HOLD_S", 0.0)

    async def body(log: AuditLog) -> None:  # kernel_start committed: the loop is held
        pending = log.record(_policy(1))
        pending.send(None)  # stops where it gives the loop back
        with pytest.raises(asyncio.CancelledError):
            pending.throw(asyncio.CancelledError())
        deadline = time.monotonic() + 10
        while _count(tmp_path) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert _count(tmp_path) == 2

    _with_log(tmp_path, body, flush_interval_s=60.0)


@pytest.mark.parametrize("checkpoint_due", [False, True])
def test_a_caller_giving_the_loop_back_as_the_log_closes_on_a_failing_disk_is_told(
    tmp_path: Path, budget: float, monkeypatch: pytest.MonkeyPatch, checkpoint_due: bool
) -> None:
    """While it lets the loop run, the writer may take its row, fail to commit it and
    shut down: the caller must get that error, never a success nor a wait forever."""
    real, failing = sqlwrites.write_now, [False]

    def write_now(*args: Any) -> Any:
        if failing[0]:
            raise sqlite3.OperationalError("disk I/O error")
        return real(*args)

    monkeypatch.setattr(sqlwrites, "write_now", write_now)

    async def scenario() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        await asyncio.sleep(0.01)
        log.record_soon(Event("syscall", input_summary="x"))  # another's, in the next commit
        await log.record(_policy(0))  # so the next caller lets the loop run first
        if checkpoint_due:
            log._last_checkpoint -= 2 * log_module.WAL_CHECKPOINT_S
        failing[0] = True
        flush = asyncio.create_task(log.flush())  # the writer runs before the caller
        caller = asyncio.create_task(log.record(_policy(1)))
        closer = asyncio.create_task(log.close())
        await asyncio.gather(flush, return_exceptions=True)
        failing[0] = False
        try:
            with pytest.raises(AuditUnavailable, match="could not commit"):
                await asyncio.wait_for(caller, 10)
        finally:  # (an open connection's thread would keep the process from ending)
            await closer

    asyncio.run(scenario())
    assert _count(tmp_path) == 3  # kernel_start and the two committed before the failure


def test_a_due_checkpoint_sends_the_commit_to_the_writer_which_then_checkpoints(
    tmp_path: Path,
) -> None:
    """Callers committing for themselves would never let the writer run its WAL
    checkpoints: when one is due, the caller waits for the writer, which runs it."""

    async def scenario() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        await asyncio.sleep(0.01)
        log._commits_since_checkpoint = log_module.WAL_CHECKPOINT_COMMITS
        step = log.record(_policy(1))
        assert step.send(None) is not None  # suspended: waiting for the writer
        step.close()  # (the row is taken; the writer commits it without this caller)
        await log.flush()  # the commit; the checkpoint follows it
        async with asyncio.timeout(10):
            while not log.stats.wal_checkpoints:
                await asyncio.sleep(0.005)
        assert _count(tmp_path) == 2 and log._commits_since_checkpoint == 0
        await log.close()

    asyncio.run(scenario())
    assert verify(tmp_path).ok


@pytest.mark.parametrize("where", ["before", "inside"])
def test_a_failed_commit_fails_its_caller_and_the_row_is_kept_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """``before``: the write fails before any SQL ran; ``inside``: the INSERT fails in the
    open transaction (a trigger stands in for the disk)."""
    real: Callable[..., Any] = sqlwrites.write_batch
    failures = [sqlite3.OperationalError("disk I/O error")]

    def flaky(*args: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(*args)

    async def scenario() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        if where == "before":
            monkeypatch.setattr(sqlwrites, "write_batch", flaky)
        else:
            await log.db.execute(
                "CREATE TEMP TRIGGER boom BEFORE INSERT ON main.audit_log "
                "WHEN instr(NEW.entry, CAST('\"revision 1\"' AS BLOB)) "
                "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
            )
        with pytest.raises(AuditUnavailable, match="could not commit: disk I/O error"):
            await log.record(_policy(1))
        assert log.stats.failed_commits == 1
        assert _count(tmp_path) == 1
        if where == "inside":  # the writer task sleeps 0.1 s after a failure: safe to use
            await log.db.execute("DROP TRIGGER temp.boom")
        await log.record(_policy(2))  # commits the kept row first, in order
        assert _count(tmp_path) == 3
        await log.close()

    asyncio.run(scenario())
    assert verify(tmp_path).ok


def test_a_lock_held_by_another_connection_never_stalls_the_loop(tmp_path: Path) -> None:
    """The kernel's other connections to the file (workflow store, conversations) hold the
    write lock across an await.  A security event recorded meanwhile must not wait for
    it on the loop's thread (the loop is what lets them commit): it goes to the
    connection's thread, and is committed once the lock is free."""

    async def scenario() -> tuple[float, float]:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        other = await aiosqlite.connect(db_path(tmp_path))
        await other.execute("CREATE TABLE IF NOT EXISTS other (x)")
        await other.commit()
        gaps: list[float] = []

        async def ticker() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticking = asyncio.create_task(ticker())
        await other.execute("INSERT INTO other VALUES (1)")  # holds the write lock

        async def release() -> None:
            await asyncio.sleep(0.3)
            await other.commit()

        releasing = asyncio.create_task(release())
        started = time.perf_counter()
        await log.record(_policy(1))
        waited = time.perf_counter() - started
        await releasing
        ticking.cancel()
        await other.close()
        assert _count(tmp_path) == 2
        await log.close()
        return waited, max(gaps)

    waited, longest_gap = asyncio.run(scenario())
    assert 0.25 < waited < 4.0  # it waited for the lock, not for the busy timeout (5 s)
    assert longest_gap < 0.2, longest_gap  # the loop kept running meanwhile
    assert verify(tmp_path).ok


def test_a_batch_nobody_waits_for_commits_off_the_loop_thread(
    tmp_path: Path, threads: list[tuple[str, int]]
) -> None:
    async def scenario() -> None:
        log = await AuditLog.open(tmp_path, flush_interval_s=0.05)
        await log.record(Event("kernel_start"))
        for n in range(3):  # few rows, nobody waiting: the timer commits them
            log.record_nowait(Event("syscall", input_summary=f"call {n}"))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if _count(tmp_path) == 4:
                break
        await log.close()

    asyncio.run(scenario())
    assert threads[:2] == [(LOOP, 1), (threads[1][0], 3)] and threads[1][0] != LOOP


@pytest.mark.parametrize(
    "head",
    [
        Head("0f" * 16, 12345, "ab" * 32),  # what the log writes
        Head('a "quoted" \\ chain', 0, "é"),  # anything else still round-trips
    ],
)
def test_the_checkpoint_record_is_sorted_json_and_reads_back(tmp_path: Path, head: Head) -> None:
    headfile = HeadFile(tmp_path / "audit.head")
    headfile.write(head, durable=True)
    headfile.close()
    raw = (tmp_path / "audit.head").read_bytes()
    assert len(raw) == HEAD_SIZE
    assert json.loads(raw) == head.to_dict()
    if head.chain_id.isalnum():
        assert raw.rstrip() == json.dumps(head.to_dict(), sort_keys=True).encode()
    assert read_head(tmp_path / "audit.head") == head


def _meta(state: Path) -> dict[str, str]:
    with closing(sqlite3.connect(db_path(state))) as conn:
        return dict(conn.execute("SELECT key, value FROM audit_meta").fetchall())


def _wal_frames(state: Path) -> int:
    """Frames in the WAL file: it only grows until the log's first checkpoint."""
    size = db_path(state).with_name("fluffy.db-wal").stat().st_size
    return (size - 32) // (4096 + 24)  # the WAL header, then each page with its header


def _marked(state: Path) -> list[int]:
    with closing(sqlite3.connect(db_path(state))) as conn:
        return [row[0] for row in conn.execute("SELECT seq FROM audit_log WHERE head = 1")]


def test_every_commit_marks_its_newest_row_in_pages_it_writes_anyway(tmp_path: Path) -> None:
    """The file's own head (ADR-099): one row is marked, the newest, moved in the commit
    that adds rows; a one-row commit writes the row's page and its index's, no page for
    the head.  audit_meta's copy starts with the chain and moves at WAL checkpoints and at
    close (rows deleted meanwhile are written again)."""

    async def scenario() -> list[int]:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        assert _meta(tmp_path)["head_seq"] == "1"  # the chain's first commit
        for n in range(3):
            await log.record(_policy(n))
            assert _marked(tmp_path) == [log.head.seq]
        for n in range(150):  # buffered, then committed in more than one statement
            log.record_soon(Event("syscall", input_summary=f"call {n}"))
        await log.record(_policy(3))
        assert _marked(tmp_path) == [log.head.seq] == [155]
        frames = []
        for n in range(4, 8):
            before = _wal_frames(tmp_path)
            await log.record(_policy(n))
            frames.append(_wal_frames(tmp_path) - before)
        assert _meta(tmp_path)["head_seq"] == "1"  # not moved by a commit
        log._commits_since_checkpoint = log_module.WAL_CHECKPOINT_COMMITS
        await log.record(_policy(8))
        async with asyncio.timeout(10):
            while not log.stats.wal_checkpoints:
                await asyncio.sleep(0.005)
        assert _meta(tmp_path)["head_seq"] == "160"
        assert _meta(tmp_path)["head_hash"] == log.durable_head.hash
        with closing(sqlite3.connect(db_path(tmp_path), isolation_level=None)) as conn:
            conn.execute("DELETE FROM audit_meta WHERE key IN ('head_seq', 'head_hash')")
        await log.record(_policy(9))
        await log.close()
        return frames

    frames = asyncio.run(scenario())
    assert frames == [2, 2, 2, 2]  # the head in audit_meta, moved by each commit: 3
    assert _meta(tmp_path)["head_seq"] == "161"
    assert _marked(tmp_path) == [161]
    assert verify(tmp_path).ok


@pytest.mark.parametrize("copied", [5, 4])
def test_a_file_written_before_the_mark_gets_it_where_its_head_says(
    tmp_path: Path, copied: int
) -> None:
    """A table without the head column (its head in audit_meta, moved with every commit)
    gets the column when the log opens it; its newest row is marked only when that head
    names it, so an end cut off before the upgrade is still found."""

    async def write() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        for n in range(4):
            await log.record(_policy(n))
        await log.close()

    asyncio.run(write())
    with closing(sqlite3.connect(db_path(tmp_path), isolation_level=None)) as conn:
        conn.execute("ALTER TABLE audit_log DROP COLUMN head")
        conn.execute("UPDATE audit_meta SET value = '6' WHERE key = 'head_seq'")
        conn.execute("DELETE FROM audit_log WHERE seq > ?", (copied,))
    assert verify(tmp_path, checkpoint=False).ok is (copied == 6)

    async def reopen() -> None:
        log = await AuditLog.open(tmp_path)
        await log.close()

    asyncio.run(reopen())
    assert _marked(tmp_path) == []
    report = verify(tmp_path, checkpoint=False)
    assert report.problem is not None and report.problem.kind == "truncated"
    assert report.problem.seq == copied + 1


def test_a_file_written_before_the_mark_verifies_and_is_marked_at_its_head(
    tmp_path: Path,
) -> None:
    async def write(more: int) -> None:
        log = await AuditLog.open(tmp_path)
        if log.empty:
            await log.record(Event("kernel_start"))
        for n in range(more):
            await log.record(_policy(n))
        await log.close()

    asyncio.run(write(4))
    with closing(sqlite3.connect(db_path(tmp_path), isolation_level=None)) as conn:
        conn.execute("ALTER TABLE audit_log DROP COLUMN head")
    assert _meta(tmp_path)["head_seq"] == "5"
    assert verify(tmp_path).ok  # the layout before ADR-099, as it is
    asyncio.run(write(0))
    assert _marked(tmp_path) == [5]  # the head audit_meta named
    asyncio.run(write(2))
    assert _marked(tmp_path) == [7]
    assert verify(tmp_path).ok


@pytest.mark.parametrize("step", ["final", "periodic"])
def test_the_wal_is_checkpointed_even_when_the_head_cannot_be_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    def locked(conn: sqlite3.Connection, head: Head) -> None:
        raise sqlite3.OperationalError("database is locked")

    async def write() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        await log.close()

    asyncio.run(write())
    wal = db_path(tmp_path).with_name("fluffy.db-wal")
    with closing(sqlite3.connect(db_path(tmp_path))) as keeper:  # keeps the WAL file
        keeper.execute("SELECT 1 FROM audit_meta").fetchall()
        with closing(sqlite3.connect(db_path(tmp_path))) as conn:
            conn.execute("INSERT INTO audit_meta VALUES ('x', 'y')")
            conn.commit()
            assert wal.stat().st_size > 0
            monkeypatch.setattr(sqlwrites, "save_head", locked)
            head = Head("c", 1, "h")
            if step == "final":
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    sqlwrites.final_checkpoint(conn, head)
                assert wal.stat().st_size == 0  # TRUNCATE ran
            else:
                executed: list[str] = []

                class Seen:  # the connection, its statements seen
                    def execute(self, sql: str, *args: Any) -> Any:
                        executed.append(sql)
                        return conn.execute(sql, *args)

                headfile = HeadFile(tmp_path / "audit.head")
                error = sqlwrites.wal_checkpoint(Seen(), headfile, head)  # type: ignore[arg-type]
                headfile.close()
                assert error.startswith("audit_meta's head not written: database is locked")
                assert executed == ["PRAGMA wal_checkpoint(RESTART)"]
