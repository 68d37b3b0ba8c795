"""Audit log write and verify throughput, beside plain sqlite3 on the same rows, in one run.

    python -m benchmarks.audit --json [--entries 50000] [--sync-entries 2000] [--callers 16]
                                      [--sync-warmup 1000] [--verify-entries 1000000]
                                      [--repeat 3]

Figures (each beside its baseline, measured in the same run on the same disk).  Every
figure is measured ``--repeat`` times (the write figures on fresh databases each time,
each after an ``os.sync()`` so no earlier write-back competes with their fsyncs; verify
on one database, built and synced once) and the median is reported, with the single
runs beside it (``*_runs_per_s``); latency percentiles pool the runs' samples.
The process first takes the kernel's interpreter settings (``kernel/process_tuning.py``).

- ``buffered_per_s``: operational ``syscall`` events (summaries, rule name, duration,
  sandbox id, a 4-key metadata map, spelled out like ``kernel/audit/observer.py`` does;
  the ``Event`` is built inside the timed loop) through :meth:`AuditLog.record_nowait`,
  yielding to the event loop every 100 events, until the final :meth:`AuditLog.flush`
  returned (its time included).  ``buffered_record_us``: the part spent in the caller.
  Baseline ``raw_sqlite_per_s``: the SAME rows read back from that run (hashes already
  computed: no row building, no hashing), inserted with plain ``sqlite3`` into a fresh
  database with the tables and indexes fluffy's has (``AUDIT_SCHEMA``),
  WAL, ``synchronous=FULL``, ``executemany`` in batches of 100, one commit per batch.
- ``sync_per_s``: ``policy_update`` events awaited one after the other by one caller
  (each returns once its row is committed with ``synchronous=FULL`` and ``audit.head``
  is rewritten); ``sync_p50_ms``/``p90``/``p99`` their latency.  ``--sync-warmup`` events
  first, untimed (1,000 = one WAL checkpoint: the WAL file has reached its steady size).
  Baseline ``raw_sqlite_sync_per_s`` (and ``raw_sqlite_sync_p50_ms``...): the same rows,
  warm-up included and untimed, into the same kind of database, one
  ``BEGIN; INSERT; COMMIT`` per row.
- ``sync_concurrent_per_s``: ``4 x --sync-entries`` events from ``--callers`` (16)
  concurrent callers (rows that arrive during a commit share the next one: group
  commit), with latency percentiles.
- ``verify_per_s``: :func:`fluffy.kernel.audit.verify.verify` (the real one, its own
  ``seconds``) over a database of ``--verify-entries`` chained entries, built directly
  with ``Event.row`` / ``entry.stored`` and bulk inserted (not timed; synced to disk
  before the first run).  It runs in a fresh
  interpreter with a small ``__main__``: verify's worker processes import ``__main__``,
  and this module's imports would add ~0.25 s to their start (the ``fluffy`` command's
  add ~0.06 s).  Baseline ``raw_scan_per_s``: one process reading every
  row's stored entry and hash with ``sqlite3`` and recomputing the SHA-256 (a plain
  sequential verifier, without the link, copy and type checks).
  ``verify_fast_check_per_s``: the part of verify that hashes and links every entry
  (:func:`fluffy.kernel.audit.ranges.parallel_intact` over the whole file), alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from benchmarks._stats import percentile
from fluffy.kernel import process_tuning
from fluffy.kernel.audit.entry import _BASE, Event, genesis_hash, stored
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.ranges import workers
from fluffy.kernel.audit.store import (
    AUDIT_SCHEMA,
    INSERT_SQL,
    MARK_HEAD_SQL,
    SELECT_ROWS,
    Head,
    HeadFile,
    db_path,
    head_path,
)

SYSCALLS = ("fs.read", "fs.write", "fs.list", "net.fetch", "proc.exec", "git.diff")
TOOLS = ("code_executor", "web_fetch", "test_runner", "linter")


def operational_events(count: int = 64) -> list[dict[str, Any]]:
    """Keyword sets for realistic ``syscall`` events (cycled by the benchmark)."""
    session = uuid.uuid4().hex
    kinds = []
    for n in range(count):
        syscall = SYSCALLS[n % len(SYSCALLS)]
        tool = TOOLS[n % len(TOOLS)]
        denied = n % 16 == 15
        path = f"src/fluffy/pkg_{n % 7}/module_{n:03d}.py"
        kinds.append(
            {
                "event_type": "syscall",
                "caller": f"tool:{tool}",
                "session_mode": "strict",
                "state_machine_state": "implementing",
                "session_id": session,
                "syscall_type": syscall,
                "tool_name": tool,
                "policy_decision": "denied" if denied else "allowed",
                "policy_rule_name": f"allow-{syscall.replace('.', '-')}-src",
                "deny_reason": "path outside the workspace" if denied else None,
                "input_summary": json.dumps(
                    {"path": path, "size": 1024 + 37 * n, "mode": "w", "encoding": "utf-8"}
                ),
                "output_summary": f"ok: {1024 + 37 * n} bytes, sha256 {uuid.uuid4().hex[:16]}",
                "duration_ms": 0.25 + n / 100,
                "sandbox_id": f"sbx-{uuid.uuid4().hex[:12]}",
                "metadata": {
                    "request_id": uuid.uuid4().hex[:16],
                    "binding": "tool",
                    "peer_pid": str(4000 + n),
                    "peer_uid": "1000",
                },
            }
        )
    return kinds


def policy_update(n: int) -> Event:
    return Event(
        "policy_update",
        caller="cli:operator",
        session_mode="strict",
        state_machine_state="idle",
        policy_rule_name=f"allow-fs-write-src-{n % 50}",
        input_summary=f"rule allow-fs-write-src-{n % 50} added: fs.write src/** (revision {n})",
        metadata={"revision": str(n), "sha256": "9f" * 32},
    )


def _all_rows(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(SELECT_ROWS + " ORDER BY seq").fetchall()
    finally:
        conn.close()


# -- fluffy ---------------------------------------------------------------------------------
async def _buffered(state_dir: Path, n: int) -> tuple[float, float, dict[str, Any]]:
    log = await AuditLog.open(state_dir)
    await log.record(Event("kernel_start", input_summary="benchmark"))
    kinds = [tuple(k.values()) for k in operational_events()]
    width = len(kinds)
    record_s = 0.0
    started = time.perf_counter()
    for start in range(0, n, 100):
        t0 = time.perf_counter()
        for i in range(start, min(n, start + 100)):
            # spelled out like a caller would (kernel/audit/observer.py), not Event(**dict)
            (_, caller, mode, state, session, syscall, tool, decision, rule, reason, summary,
             output, duration, sandbox, metadata) = kinds[i % width]  # fmt: skip
            log.record_nowait(
                Event(
                    "syscall",
                    caller=caller,
                    session_id=session,
                    session_mode=mode,
                    state_machine_state=state,
                    syscall_type=syscall,
                    tool_name=tool,
                    policy_decision=decision,
                    policy_rule_name=rule,
                    deny_reason=reason,
                    input_summary=summary,
                    output_summary=output,
                    duration_ms=duration,
                    sandbox_id=sandbox,
                    metadata=dict(metadata),
                )
            )
        record_s += time.perf_counter() - t0
        await asyncio.sleep(0)
    await log.flush()
    elapsed = time.perf_counter() - started
    stats = msgspec.structs.asdict(log.stats)
    await log.close()
    return elapsed, record_s, stats


async def _sync(state_dir: Path, n: int, callers: int, warmup: int) -> tuple[float, list[float]]:
    log = await AuditLog.open(state_dir)
    await log.record(Event("kernel_start", input_summary="benchmark"))
    for i in range(warmup):
        await log.record(policy_update(-i))
    samples: list[float] = []
    per_caller = n // callers

    async def caller(offset: int) -> None:
        for i in range(per_caller):
            event = policy_update(offset + i)
            t0 = time.perf_counter()
            await log.record(event)
            samples.append((time.perf_counter() - t0) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(caller(c * per_caller) for c in range(callers)))
    elapsed = time.perf_counter() - started
    await log.close()
    return per_caller * callers / elapsed, samples


# -- plain sqlite3 baselines ------------------------------------------------------------------
def _raw_connect(path: Path) -> sqlite3.Connection:
    """Plain sqlite3, the tables and indexes fluffy's database has, WAL, synchronous=FULL."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.executescript(AUDIT_SCHEMA)
    return conn


def raw_batched(path: Path, rows: list[tuple[Any, ...]], batch: int = 100) -> float:
    """Rows per second: executemany of ``batch`` rows, one commit per batch."""
    conn = _raw_connect(path)
    try:
        started = time.perf_counter()
        for start in range(0, len(rows), batch):
            conn.execute("BEGIN")
            conn.executemany(INSERT_SQL, rows[start : start + batch])
            conn.execute("COMMIT")
        return len(rows) / (time.perf_counter() - started)
    finally:
        conn.close()


def raw_sync(path: Path, rows: list[tuple[Any, ...]], warmup: int) -> tuple[float, list[float]]:
    """One INSERT + COMMIT per row (the first ``warmup`` untimed): rows/s, latency (ms)."""
    conn = _raw_connect(path)
    samples = []
    try:
        for row in rows[:warmup]:
            conn.execute("BEGIN")
            conn.execute(INSERT_SQL, row)
            conn.execute("COMMIT")
        started = time.perf_counter()
        for row in rows[warmup:]:
            t0 = time.perf_counter()
            conn.execute("BEGIN")
            conn.execute(INSERT_SQL, row)
            conn.execute("COMMIT")
            samples.append((time.perf_counter() - t0) * 1000)
        return len(samples) / (time.perf_counter() - started), samples
    finally:
        conn.close()


# -- verify ---------------------------------------------------------------------------------
def build_chain(state_dir: Path, entries: int) -> None:
    """A valid chain of ``entries`` rows, written directly (fast, not through the log)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db_path(state_dir), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.executescript(AUDIT_SCHEMA)
    kinds = operational_events()
    width = len(kinds)
    events = [Event(**k) for k in kinds]
    ts = 1_790_000_000_000
    first = Event("kernel_start", input_summary="benchmark")
    prev = genesis_hash(ts)
    seq = 0
    chain_id = uuid.uuid4().hex
    conn.execute("BEGIN")
    while seq < entries:
        chunk = []
        for _ in range(min(50_000, entries - seq)):
            seq += 1
            event = first if seq == 1 else events[seq % width]
            row = stored(event.row(seq, ts + seq // 20, prev))
            prev = row[-1]
            chunk.append(row)
        conn.executemany(INSERT_SQL, chunk)
    conn.execute(MARK_HEAD_SQL, (seq - 1, seq))  # the writer's mark on its newest row
    conn.executemany(
        "INSERT OR REPLACE INTO audit_meta VALUES (?, ?)",
        [("chain_id", chain_id), ("head_seq", str(seq)), ("head_hash", prev)],
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    head = HeadFile(head_path(state_dir))
    head.write(Head(chain_id, seq, prev), durable=True)
    head.close()


def raw_scan(path: Path) -> float:
    """Rows per second: one process fetching every row and recomputing its hash."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    count, bad = 0, 0
    try:
        started = time.perf_counter()
        cursor = conn.execute("SELECT entry, hash FROM audit_log ORDER BY seq")
        while batch := cursor.fetchmany(4096):
            for entry, hash_ in batch:
                digest = _BASE.copy()
                digest.update(entry)
                bad += digest.hexdigest() != hash_
                count += 1
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    assert bad == 0
    return count / elapsed


VERIFY = """
import json, sys, time
from pathlib import Path
from fluffy.kernel.audit.ranges import parallel_intact
from fluffy.kernel.audit.store import db_path
from fluffy.kernel.audit.verify import verify
report = verify(Path(sys.argv[1])).to_dict()
started = time.perf_counter()
whole = parallel_intact(db_path(Path(sys.argv[1])), 1, report["entries"])
report["fast_check_seconds"] = time.perf_counter() - started
report["fast_check_intact"] = whole is not None
print(json.dumps(report))
"""


def run_verify(state_dir: Path) -> dict[str, Any]:
    """The real verify() in a fresh interpreter with a small ``__main__`` (verify's worker
    processes import ``__main__``: this module's imports would slow their start)."""
    done = subprocess.run(
        [sys.executable, "-c", VERIFY, str(state_dir)], capture_output=True, check=True
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _ms(samples: list[float], prefix: str, result: dict[str, Any]) -> None:
    for q in (50, 90, 99):
        result[f"{prefix}_p{q}_ms"] = round(percentile(samples, q / 100), 3)


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _figure(result: dict[str, Any], name: str, runs: list[float]) -> None:
    """``<name>_per_s``: the median of the runs; ``<name>_runs_per_s``: each run."""
    result[f"{name}_per_s"] = round(_median(runs))
    result[f"{name}_runs_per_s"] = [round(v) for v in runs]


def _writes(root: Path, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Buffered and sync figures, each run ``--repeat`` times beside its baseline."""
    buffered, raw, record_us, commits = [], [], [], []
    sync, raw_sync_rates, concurrent = [], [], []
    sync_ms: list[float] = []
    raw_sync_ms: list[float] = []
    concurrent_ms: list[float] = []
    for run in range(args.repeat):
        here = root / f"run-{run}"
        os.sync()  # nothing of an earlier run (or program) still being written back
        elapsed, record_s, stats = asyncio.run(_buffered(here / "buffered", args.entries))
        buffered.append(args.entries / elapsed)
        record_us.append(record_s / args.entries * 1e6)
        commits.append(stats["commits"])
        raw.append(raw_batched(here / "raw.db", _all_rows(db_path(here / "buffered"))))

        os.sync()  # the buffered runs' files are still being written back: not during fsyncs
        per_s, samples = asyncio.run(_sync(here / "sync", args.sync_entries, 1, args.sync_warmup))
        sync.append(per_s)
        sync_ms += samples
        os.sync()
        per_s, samples = asyncio.run(
            _sync(here / "group", args.sync_entries * 4, args.callers, args.sync_warmup)
        )
        concurrent.append(per_s)
        concurrent_ms += samples
        rows = _all_rows(db_path(here / "sync"))
        os.sync()
        per_s, samples = raw_sync(here / "raw-sync.db", rows, 1 + args.sync_warmup)
        raw_sync_rates.append(per_s)
        raw_sync_ms += samples
        shutil.rmtree(here)
    _figure(result, "buffered", buffered)
    result["buffered_record_us"] = round(_median(record_us), 2)
    result["buffered_commits"] = commits
    _figure(result, "raw_sqlite", raw)
    result["ratio_buffered_vs_raw"] = round(
        result["buffered_per_s"] / result["raw_sqlite_per_s"], 3
    )
    _figure(result, "sync", sync)
    _ms(sync_ms, "sync", result)
    _figure(result, "sync_concurrent", concurrent)
    _ms(concurrent_ms, "sync_concurrent", result)
    _figure(result, "raw_sqlite_sync", raw_sync_rates)
    _ms(raw_sync_ms, "raw_sqlite_sync", result)
    result["ratio_sync_vs_raw"] = round(result["sync_per_s"] / result["raw_sqlite_sync_per_s"], 3)


def _verify(root: Path, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Verify figures over one database of ``--verify-entries``, ``--repeat`` times."""
    started = time.perf_counter()
    build_chain(root / "verify", args.verify_entries)
    os.sync()  # verify a log at rest, not one the kernel is still writing back
    result["verify_build_s"] = round(time.perf_counter() - started, 1)
    path = db_path(root / "verify")
    result["verify_db_mb"] = round(path.stat().st_size / 2**20, 1)
    scans, verifies, fast = [], [], []
    for _ in range(args.repeat):
        scans.append(raw_scan(path))
        report = run_verify(root / "verify")
        assert report["ok"] and report["entries"] == args.verify_entries, report
        assert report["fast_check_intact"], report
        verifies.append(args.verify_entries / report["seconds"])
        fast.append(args.verify_entries / report["fast_check_seconds"])
    _figure(result, "raw_scan", scans)
    _figure(result, "verify", verifies)
    result["verify_s"] = round(args.verify_entries / result["verify_per_s"], 3)
    result["verify_fast_check_per_s"] = round(_median(fast))
    result["ratio_verify_vs_raw_scan"] = round(result["verify_per_s"] / result["raw_scan_per_s"], 3)


def main(argv: list[str] | None = None) -> int:
    process_tuning.tune()  # the kernel process's interpreter settings (its switch interval)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.audit")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--entries", type=int, default=50_000, help="buffered events")
    parser.add_argument("--sync-entries", type=int, default=2_000, help="awaited events")
    parser.add_argument("--callers", type=int, default=16, help="concurrent sync callers")
    parser.add_argument(
        "--sync-warmup",
        type=int,
        default=1000,
        help="untimed awaited events first (1,000 = one WAL checkpoint: steady state)",
    )
    parser.add_argument("--verify-entries", type=int, default=1_000_000)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of every figure (the median is reported)"
    )
    parser.add_argument("--dir", help="where to put the databases (default: a temp dir)")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {
        "entries": args.entries,
        "sync_entries": args.sync_entries,
        "sync_warmup": args.sync_warmup,
        "callers": args.callers,
        "verify_entries": args.verify_entries,
        "repeat": args.repeat,
        "cpus": workers(),
    }
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        _writes(Path(tmp), args, result)
        _verify(Path(tmp), args, result)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:<32} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
