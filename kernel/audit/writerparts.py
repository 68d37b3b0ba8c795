"""The audit writer's tuning and the records it keeps (:mod:`fluffy.kernel.audit.log`).

Speed (ADR-026, ADR-075; ``python -m benchmarks.audit``): a commit is ONE call of
:func:`~fluffy.kernel.audit.sqlwrites.write_batch`, run where it costs least:

* a batch somebody waits for (a security event, ``AuditLog.flush``) of at most
  :data:`INLINE_ROWS` rows on the event loop's own thread, while small commits have
  lately been fast (:data:`INLINE_BUDGET_S`) and the write lock is free at once
  (``write_now``): a hand-off to the connection's thread and back costs two thread
  wake-ups, ~110 µs, a third of a durable one-row commit; a security event recorded
  while the writer holds no batch is committed so by its caller
  (``AuditLog._commit_here``);
* anything else (buffered rows, slow commits, a lock another connection holds, WAL
  checkpoints -- SQLite's automatic ones are off --, storage work, and
  ``AuditLog.commit_pending``) on aiosqlite's thread.

Either way a security event's caller resumes only once its row is durable.  The
figures behind each number are in the comments below, ADR-026 and ADR-075.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgspec

from fluffy.errors import AuditUnavailable

log = logging.getLogger("fluffy.kernel.audit")

WAL_CHECKPOINT_WRITES = 1000
# ... or every WAL_CHECKPOINT_COMMITS commits: a one-row commit appends 3-4 pages to the
# WAL, and SQLite's own automatic checkpoint (off on this connection: it would run inside
# a commit, maybe on the loop's thread) kept the WAL near 1,000 pages.  Past
# journal_size_limit the WAL would be cut after every checkpoint and grow again, and a
# durable commit into a growing file costs more than into one it overwrites (measured:
# one caller 1,700-1,800 events/s without this, 2,200-2,900 with it; WAL ~1,600 pages).
WAL_CHECKPOINT_COMMITS = 400
WAL_CHECKPOINT_S = 60.0
WAL_SIZE_LIMIT = 8 * 1024 * 1024
# A waited-for batch is committed on the event loop's thread (no thread hand-off) when
# it holds at most INLINE_ROWS rows and such small commits have lately taken at most
# INLINE_BUDGET_S (an exponential moving average, weight COMMIT_EWMA, of every small
# commit, failed ones included).  It is a budget, not a limit: a commit that has begun
# cannot be interrupted, so one stalled fsync still holds the loop for its length; the
# average then sends the next small commits to the thread until commits are fast again.
# 2 ms is 4 % of a tool call's 50 ms budget.
INLINE_ROWS = 64
INLINE_BUDGET_S = 0.002
COMMIT_EWMA = 0.2
# A security event's caller commits it itself while the writer is idle (ADR-075); once
# such commits have held the loop for CALLER_HOLD_S (the inline budget) since it last ran
# anything else, the next caller lets everything ready run once first (ADR-096).
CALLER_HOLD_S = INLINE_BUDGET_S


class WriterStats(msgspec.Struct):
    committed: int = 0
    commits: int = 0
    inline_commits: int = 0  # committed on the event loop's thread (see ADR-026)
    commit_ms: float = 0.0  # moving average of a commit's duration
    failed_commits: int = 0
    wal_checkpoints: int = 0
    last_error: str = ""

    def timed(self, started: float) -> None:
        """A small commit begun at ``started`` (perf_counter) ended: into the average."""
        spent = (time.perf_counter() - started) * 1000
        self.commit_ms += COMMIT_EWMA * (spent - self.commit_ms)

    def commit_failed(self, exc: Exception, kept: int) -> AuditUnavailable:
        """A commit failed (rolled back; its ``kept`` rows stay buffered): counted, logged,
        and the error its waiters get."""
        self.failed_commits += 1
        self.last_error = str(exc)
        log.error("audit commit failed (%d rows kept for retry): %s", kept, exc)
        return AuditUnavailable(f"the audit log could not commit: {exc}")

    def head_written(self, failed: OSError | None) -> None:
        """The rows are committed; say so when ``audit.head`` could not be rewritten."""
        if failed is not None:
            self.last_error = str(failed)
            log.error("audit checkpoint file not written: %s", failed)


class Batch(msgspec.Struct):
    rows: list[tuple[Any, ...]] = msgspec.field(default_factory=list)
    waiters: list[asyncio.Future[None]] = msgspec.field(default_factory=list)
    durable: bool = False
    new_chain: str | None = None  # set with the genesis entry
    threaded: bool = False  # committed on the connection's thread, however small
