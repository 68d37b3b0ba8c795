"""The audit log writer: one task owns the database connection (design: Sync/Async Write).

:meth:`AuditLog.record` assigns the sequence number and chains the hash at once, in the
event loop, so the order of the log is the order of the calls.  Rows wait in a buffer
that one writer task commits:

* security events (:data:`~fluffy.kernel.audit.entry.SYNC_EVENTS`) return only once
  their row is durably committed (``synchronous=FULL``) and the head checkpoint is
  written: committed by the caller itself while the writer is idle, else by the writer,
  which it wakes and waits for; a failed commit raises :class:`AuditUnavailable` to it;
* operational events return at once and are committed when 100 are waiting or 500 ms
  have passed, and on :meth:`close` (the crash window: one buffer).

Every commit also moves the head's mark to its newest row (one statement in the same
transaction, ADR-099) and rewrites the ``audit.head`` checkpoint after the commit (so it
never runs ahead of the database; it is fsynced with every WAL checkpoint and at
shutdown).  WAL checkpoints (which copy the head to ``audit_meta``) run every 1,000
writes, 400 commits or 60 s; storage rules (rotation, retention, size) run between
commits (:mod:`fluffy.kernel.audit.storage`).

Where each commit runs (the event loop's own thread or aiosqlite's) is the writer's
speed: :mod:`fluffy.kernel.audit.writerparts` says how it is chosen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiosqlite

from fluffy.errors import AuditUnavailable
from fluffy.kernel.audit import sqlwrites
from fluffy.kernel.audit.entry import (
    _BASE,
    SYNC_EVENTS,
    Event,
    _encode,
    genesis_hash,
    now_ms,
)
from fluffy.kernel.audit.storage import Storage, StorageSettings
from fluffy.kernel.audit.store import (
    BUSY_TIMEOUT_MS,
    PRAGMAS,
    Head,
    HeadFile,
    create_tables,
    db_path,
    fetch_meta,
    head_path,
)
from fluffy.kernel.audit.writerparts import (
    CALLER_HOLD_S,
    INLINE_BUDGET_S,
    INLINE_ROWS,
    WAL_CHECKPOINT_COMMITS,
    WAL_CHECKPOINT_S,
    WAL_CHECKPOINT_WRITES,
    WAL_SIZE_LIMIT,
    Batch,
    WriterStats,
)

log = logging.getLogger("fluffy.kernel.audit")


class AuditLog:
    """The kernel's audit log.  Create with :meth:`open`; always :meth:`close`."""

    def __init__(
        self,
        state_dir: Path,
        db: aiosqlite.Connection,
        *,
        clock: Callable[[], int] = now_ms,
        max_buffer: int = 100,
        flush_interval_s: float = 0.5,
        settings: StorageSettings | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.db = db
        self.clock = clock
        self.max_buffer = max_buffer
        self.flush_interval_s = flush_interval_s
        self.stats = WriterStats()
        self.storage = Storage(state_dir, settings or StorageSettings(), clock)
        self._batch = Batch()
        self._wake = asyncio.Event()
        self._closing = False
        self._chain_id = ""
        self._seq = 0
        self._durable = Head("", 0, "")
        self._hash = ""
        self._headfile = HeadFile(head_path(state_dir))
        self._task: asyncio.Task[None] | None = None
        self._since_checkpoint = 0
        self._commits_since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self._waits_for_lock = True  # PRAGMAS set busy_timeout (see _lock_wait)
        self._writing = False  # the writer task holds a batch (commit, maintenance)
        self._held_since = 0.0  # callers' commits hold the loop since (0: they do not)
        self._group = False  # the last such commit was others' too: the next one waits
        self._yielding = False  # a caller lets the loop run, then commits what is buffered
        #: no rotation or archive deletion while set (the start's verification reads them)
        self.storage_held = False

    # -- opening and closing ----------------------------------------------------------
    @classmethod
    async def open(cls, state_dir: Path, **options: Any) -> AuditLog:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            # check_same_thread=False: small waited-for commits run on the loop's thread
            # while the writer task holds the connection (never two threads at once)
            db = await aiosqlite.connect(db_path(state_dir), check_same_thread=False)
            for pragma in PRAGMAS:
                await db.execute(pragma)
            await db._execute(create_tables, db._conn)  # type: ignore[no-untyped-call]
            await db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            # checkpoints are the writer's own (_maintain, on the connection's thread):
            # SQLite's automatic one would run inside a commit, maybe on the loop's thread
            await db.execute("PRAGMA wal_autocheckpoint=0")
            await db.commit()
        except Exception as exc:
            raise AuditUnavailable(f"cannot open the audit database in {state_dir}: {exc}") from exc
        self = cls(state_dir, db, **options)
        await self._load_head()
        await self.storage.finish_rotation(db)
        self._task = asyncio.create_task(self._writer(), name="audit-writer")
        return self

    async def _load_head(self) -> None:
        meta = await fetch_meta(self.db)
        self._chain_id = meta.get("chain_id", "")
        rows = list(
            await self.db.execute_fetchall(
                "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1"
            )
        )
        if rows:
            self._seq, self._hash = int(rows[0][0]), str(rows[0][1])
        elif "anchor_seq" in meta:  # everything was archived: continue from the anchor
            self._seq, self._hash = int(meta["anchor_seq"]), meta["anchor_hash"]
        self._durable = self.head

    @property
    def head(self) -> Head:
        """The newest recorded entry (seq, hash): what an outside witness keeps."""
        return Head(self._chain_id, self._seq, self._hash)

    @property
    def durable_head(self) -> Head:
        """The newest *committed* entry: what the bootstrap's witness may keep (a head
        still in the buffer could be lost by a crash, and would then read as a rollback)."""
        return self._durable

    @property
    def empty(self) -> bool:
        return self._seq == 0

    async def close(self) -> None:
        """Flush everything, write the checkpoint durably, close the connection."""
        if self._closing:
            return
        self._closing = True
        self._batch.durable = True
        self._wake.set()
        if self._task is not None:
            await self._task
        with contextlib.suppress(Exception):
            await self._run(sqlwrites.final_checkpoint, self._durable)
        with contextlib.suppress(Exception):
            await self.db.close()
        self._headfile.close()

    # -- recording ----------------------------------------------------------------------
    def _append(
        self, event: Event, *, internal: bool = False, wake: bool = True
    ) -> tuple[int, bool]:
        """Chain ``event`` into the buffer: (seq, is it a security event?).  A security
        event wakes the writer unless ``wake`` is False (its caller may commit it)."""
        if self._closing and not internal:
            raise AuditUnavailable("the audit log is closed", why="the kernel is shutting down")
        timestamp = self.clock()
        if self._seq == 0:
            if event.event_type != "kernel_start":
                raise AuditUnavailable(
                    "the first entry of a chain must be kernel_start",
                    why=f"{event.event_type} was recorded before the kernel started its log",
                    fix="This is a bug in fluffy; please report it.",
                )
            prev = genesis_hash(timestamp)
            self._chain_id = uuid.uuid4().hex
            self._batch.new_chain = self._chain_id
        else:
            prev = self._hash
        seq = self._seq + 1
        entry = _encode(event.row(seq, timestamp, prev))
        digest = _BASE.copy()  # entry.stored(row), inlined: this is the hot path
        digest.update(entry)
        hash_ = digest.hexdigest()
        batch = self._batch
        rows = batch.rows
        rows.append((seq, timestamp, event.event_type, entry, hash_))
        self._seq, self._hash = seq, hash_
        self.storage.saw(timestamp)
        sync = event.event_type in SYNC_EVENTS
        if sync:
            batch.durable = True
            if wake:
                self._wake.set()
        elif len(rows) >= self.max_buffer:
            self._wake.set()
        return seq, sync

    async def record(self, event: Event) -> int:
        """Record ``event``; security events return only once durably committed."""
        seq, sync = self._append(event, wake=False)
        if not sync:
            return seq
        if not self._yielding and self._held_up():
            await self._commit_after_others()
            return seq
        if not self._commit_here():
            self._wake.set()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._batch.waiters.append(waiter)
            await waiter
        return seq

    async def _commit_after_others(self) -> None:
        """Let everything ready run once (other callers add their rows), then commit the
        buffer; the waiter joins it first, so whoever commits or fails the row answers."""
        batch = self._batch
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        batch.waiters.append(waiter)
        self._yielding, self._group = True, False
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:  # nobody waits now; its row is the writer's
            waiter.cancel()
            self._wake.set()
            raise
        finally:
            self._yielding = False
        if not waiter.done() and self._batch is batch:
            try:
                if not self._commit_here(own=waiter):
                    self._wake.set()
            except BaseException:  # raised to this caller; the writer retries the rows
                waiter.cancel()
                raise
        await waiter

    def _held_up(self) -> bool:
        """Must the loop run what is ready first?  Yes once callers' commits held it for
        :data:`CALLER_HOLD_S`, or the last was others' too (they come back with more)."""
        held = self._held_since
        return self._group or bool(held and time.perf_counter() - held >= CALLER_HOLD_S)

    def _commit_here(self, own: asyncio.Future[None] | None = None) -> bool:
        """Commit the buffer in the caller, on the loop's thread, while the writer task
        is idle (ADR-075).  False -- the writer commits it -- when the writer holds a
        batch or is gone, the batch is not small, small commits are slow lately, a WAL
        checkpoint is due, the write lock is taken, or another caller lets the loop run
        first (:meth:`_commit_after_others`; ``own``: this caller's waiter in the buffer).
        A failed commit raises :class:`AuditUnavailable`; the rows stay for the writer."""
        batch = self._batch
        if (
            self._writing
            or self._closing
            or self._task is None
            or self._task.done()
            or self._yielding
            or not self._fits_loop(batch)
            or self._checkpoint_due()
        ):
            return False
        rows = batch.rows
        head = self._head_of(rows)
        self._lock_wait(False)
        started = time.perf_counter()
        try:
            done, failed = sqlwrites.write_now(
                self.db._conn, rows, batch.new_chain, self._headfile, head
            )
        except Exception as exc:  # rolled back: the rows stay buffered, the writer retries
            self._wake.set()
            raise self.stats.commit_failed(exc, len(rows)) from exc
        finally:
            self.stats.timed(started)
        if not done:
            return False
        self._batch = Batch()
        self._wake.clear()  # nothing left for the writer (set by a flush or a full buffer)
        if not self._held_since:  # the hold ends when the loop runs anything else
            self._held_since = started
            asyncio.get_running_loop().call_soon(self._release)
        self._group = bool(batch.waiters) and any(w is not own for w in batch.waiters)
        self.stats.inline_commits += 1
        self.stats.head_written(failed)
        self._committed(batch, head)
        return True

    def _release(self) -> None:
        self._held_since = 0.0

    def record_soon(self, event: Event) -> asyncio.Future[None]:
        """Record ``event`` now (its place in the chain taken at once); the future is
        done when it is durably committed (or fails with the commit's error)."""
        self._append(event)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._batch.waiters.append(waiter)
        self._wake.set()
        return waiter

    def record_nowait(self, event: Event) -> int:
        """Record an operational event from synchronous code (never waits)."""
        seq, sync = self._append(event)
        if sync:  # still durable soon, but nobody waits for it
            self._wake.set()
        return seq

    async def commit_pending(self) -> None:
        """Commit what is buffered on the connection's thread, however small, and return
        once it is durable (at once when nothing is buffered or being committed): the
        loop runs on meanwhile (the session loop builds the model's context)."""
        batch = self._batch
        if not (batch.rows or batch.new_chain or self._writing):
            return
        batch.threaded = True
        await self.flush()

    async def flush(self) -> None:
        """Commit everything buffered so far."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._batch.waiters.append(waiter)
        self._wake.set()
        await waiter

    # -- the writer task ----------------------------------------------------------------
    async def _writer(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake
        while True:
            if not wake.is_set():
                # a timer instead of asyncio.wait_for: no task per wake-up
                timer = loop.call_later(self.flush_interval_s, wake.set)
                try:
                    await wake.wait()
                finally:
                    timer.cancel()
                if not wake.is_set():  # a caller committed the buffer meanwhile
                    continue
            wake.clear()
            batch, self._batch = self._batch, Batch()
            self._writing = True
            try:
                if batch.rows or batch.waiters:
                    await self._commit(batch)
                await self._maintain()
            except Exception as exc:  # never die silently: callers would wait forever
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("audit writer step failed; retrying")
                if self._closing:
                    self._fail_pending(AuditUnavailable(f"the audit log failed: {exc}"))
                    return
                await asyncio.sleep(0.1)
            finally:
                self._writing = False
            if self._closing and not self._batch.rows and not self._batch.waiters:
                return

    def _fail_pending(self, error: AuditUnavailable) -> None:
        for waiter in self._batch.waiters:
            if not waiter.done():
                waiter.set_exception(error)
        self._batch = Batch()

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(sqlite3_connection, *args)`` on the connection's own thread in one hop:
        aiosqlite's ``Connection._execute``, which its public methods wrap (one per
        statement)."""
        db = self.db
        self._lock_wait(True)
        return await db._execute(lambda: fn(db._conn, *args))  # type: ignore[no-untyped-call]

    def _lock_wait(self, wait: bool) -> None:
        """Let the connection wait for the write lock (its own thread), or not (the loop's);
        set only when it changes (two such ``PRAGMA`` were ~17 µs of a 0.37 ms security
        event).  Never called while the thread runs a batch."""
        if wait != self._waits_for_lock:
            timeout = BUSY_TIMEOUT_MS if wait else 0
            self.db._conn.execute(f"PRAGMA busy_timeout={timeout}")
            self._waits_for_lock = wait

    def _inline(self, batch: Batch) -> bool:
        """Commit ``batch`` on the loop's thread?  Only a small one somebody waits for,
        while small commits have lately been fast (a slow disk sends them to the thread)."""
        return bool(batch.waiters) and not batch.threaded and self._fits_loop(batch)

    def _fits_loop(self, batch: Batch) -> bool:
        """Small, while small commits have lately been fast: may hold the loop's thread."""
        return len(batch.rows) <= INLINE_ROWS and self.stats.commit_ms <= INLINE_BUDGET_S * 1000

    def _head_of(self, rows: list[tuple[Any, ...]]) -> Head:
        """The head a commit of ``rows`` (not empty) moves the chain to."""
        return Head(self._chain_id, int(rows[-1][0]), str(rows[-1][-1]))

    async def _commit(self, batch: Batch) -> None:
        rows = batch.rows
        head = self._head_of(rows) if rows else None
        try:
            if rows or batch.new_chain:
                args = (rows, batch.new_chain, self._headfile, head)
                started = time.perf_counter()
                try:
                    done, failed = False, None
                    if self._inline(batch):
                        self._lock_wait(False)
                        done, failed = sqlwrites.write_now(self.db._conn, *args)
                        self.stats.inline_commits += done
                    if not done:
                        failed = await self._run(sqlwrites.write_batch, *args)
                finally:  # failed commits count too; big batches say nothing of small ones
                    if len(rows) <= INLINE_ROWS:
                        self.stats.timed(started)
                self.stats.head_written(failed)
        except Exception as exc:  # disk full, I/O error: keep the rows, fail the waiters
            error = self.stats.commit_failed(exc, len(rows))
            retry = Batch(batch.rows + self._batch.rows, self._batch.waiters, True, batch.new_chain)
            self._batch = retry
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_exception(error)
            if not self._closing:
                await asyncio.sleep(0.1)
            else:  # give up at shutdown rather than loop forever; nobody is left waiting
                self._fail_pending(error)
            return
        if batch.durable and self._closing:
            try:
                await asyncio.to_thread(self._headfile.sync)
            except OSError as exc:  # the rows are committed; only the checkpoint lags
                log.warning("audit.head not synced: %s", exc)
        self._committed(batch, head)

    def _committed(self, batch: Batch, head: Head | None) -> None:
        """``batch`` is durable: move the durable head, count it, wake its waiters."""
        if head is not None:
            self._durable = head
        if batch.rows:
            self.stats.committed += len(batch.rows)
            self.stats.commits += 1
            self._since_checkpoint += len(batch.rows)
            self._commits_since_checkpoint += 1
        for waiter in batch.waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _checkpoint_due(self) -> bool:
        return (
            self._since_checkpoint >= WAL_CHECKPOINT_WRITES
            or self._commits_since_checkpoint >= WAL_CHECKPOINT_COMMITS
            or bool(
                self._since_checkpoint
                and time.monotonic() - self._last_checkpoint >= WAL_CHECKPOINT_S
            )
        )

    async def _maintain(self) -> None:
        if self._checkpoint_due():
            error = await self._run(sqlwrites.wal_checkpoint, self._headfile, self._durable)
            if error:
                log.warning("WAL checkpoint failed: %s", error)
            else:
                self.stats.wal_checkpoints += 1
            self._since_checkpoint = self._commits_since_checkpoint = 0
            self._last_checkpoint = time.monotonic()
            if not self.storage_held:  # (also at close: internal events)
                for event in self.storage.check_size():
                    self._append(event, internal=True)
            if self.storage.doomed:  # record the deletions durably, then delete the files
                batch, self._batch = self._batch, Batch()
                batch.durable = True
                await self._commit(batch)
                if not self._batch.rows:  # committed (a failed commit puts the rows back)
                    self.storage.unlink_doomed()
        held = self._closing or self.storage_held
        midnight = None if held else self.storage.rotation_due()
        if midnight is not None:
            self._lock_wait(True)
            for event in await self.storage.maybe_rotate(self.db, self._chain_id, midnight):
                self._append(event)
