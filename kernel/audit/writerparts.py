"""The audit writer's tuning and the records it keeps (:mod:`fluffy.kernel.audit.log`).

The figures behind each number are in ``kernel/audit/log.py``'s docstring, ADR-026 and
ADR-075; ``python -m benchmarks.audit`` measures them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

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
# A security event's caller commits it itself while the writer is idle (ADR-075), at
# most CALLER_COMMITS times before the loop runs anything else: a run of them then
# waits for the writer once, and other tasks get their turn (8 x the 2 ms budget).
CALLER_COMMITS = 8


class WriterStats(msgspec.Struct):
    committed: int = 0
    commits: int = 0
    inline_commits: int = 0  # committed on the event loop's thread (see ADR-026)
    commit_ms: float = 0.0  # moving average of a commit's duration
    failed_commits: int = 0
    wal_checkpoints: int = 0
    last_error: str = ""


class Batch(msgspec.Struct):
    rows: list[tuple[Any, ...]] = msgspec.field(default_factory=list)
    waiters: list[asyncio.Future[None]] = msgspec.field(default_factory=list)
    durable: bool = False
    new_chain: str | None = None  # set with the genesis entry
    threaded: bool = False  # committed on the connection's thread, however small
