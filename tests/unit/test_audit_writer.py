"""Where the audit writer commits (ADR-026), and what a failed commit does.

A batch somebody waits for, small and while commits are fast, is committed on the event
loop's thread; buffered rows, big batches and slow disks go to the connection's thread.
Either way the caller of a security event resumes only once its row is committed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import AuditUnavailable
from fluffy.kernel.audit import log as log_module
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import INLINE_BUDGET_S, INLINE_ROWS, AuditLog
from fluffy.kernel.audit.store import db_path
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
    real: Callable[..., Any] = log_module._write_batch

    def spy(conn: sqlite3.Connection, rows: list[Any], *args: Any) -> Any:
        seen.append((threading.current_thread().name, len(rows)))
        return real(conn, rows, *args)

    monkeypatch.setattr(log_module, "_write_batch", spy)
    return seen


LOOP = threading.main_thread().name


def test_an_awaited_event_commits_on_the_loop_thread_and_is_on_disk_when_it_returns(
    tmp_path: Path, threads: list[tuple[str, int]]
) -> None:
    async def scenario() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        for n in range(5):
            await log.record(_policy(n))
            assert _count(tmp_path) == n + 2  # another connection reads it: committed
        assert log.stats.inline_commits == 6
        assert 0 < log.stats.commit_ms < INLINE_BUDGET_S * 1000
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
    tmp_path: Path, threads: list[tuple[str, int]]
) -> None:
    async def scenario() -> int:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        log.stats.commit_ms = 25 * INLINE_BUDGET_S * 1000  # as if the disk had stalled
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


def test_a_failed_commit_fails_its_caller_and_the_row_is_kept_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real: Callable[..., Any] = log_module._write_batch
    failures = [sqlite3.OperationalError("disk I/O error")]

    def flaky(*args: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(*args)

    async def scenario() -> None:
        log = await AuditLog.open(tmp_path)
        await log.record(Event("kernel_start"))
        monkeypatch.setattr(log_module, "_write_batch", flaky)
        with pytest.raises(AuditUnavailable, match="could not commit: disk I/O error"):
            await log.record(_policy(1))
        assert log.stats.failed_commits == 1
        await log.record(_policy(2))  # commits the kept row first, in order
        assert _count(tmp_path) == 3
        await log.close()

    asyncio.run(scenario())
    assert verify(tmp_path).ok
