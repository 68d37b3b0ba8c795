"""What a session's page shows beyond its timeline, read from the project's state
database without the kernel: its test runs (red or green, each failing test and its
message) and its reviews and merges (the diff the person saw, who decided, the commit
that followed).

Read-only (``mode=ro``): the kernel writes the same file, the view never does.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Any

import msgspec

from fluffy.host.audit import Filters, connect_ro, db_path, entries

#: The newest runs a session's page shows, and the failing tests shown of each.
RUNS_SHOWN = 20
FAILURES_SHOWN = 50
#: The newest reviews (merge decisions) a session's page shows.
REVIEWS_SHOWN = 50
#: The most of a decided diff shown (the kernel keeps up to 2,000,000 characters).
DIFF_SHOWN = 500_000
OUTCOMES = ("passed", "failed", "error", "skipped")
_SHA = re.compile(r'"commit"\s*:\s*"([0-9a-f]{7,64})"')


def test_runs(state: Path, session_id: str) -> list[dict[str, Any]]:
    """The session's newest test runs, oldest first: when, in which state, red or green,
    the counts, and the failing tests with their messages."""
    if not db_path(state).exists():
        return []
    conn = connect_ro(db_path(state))
    try:
        if not conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'test_runs'"
        ).fetchone():
            return []
        rows = conn.execute(
            "SELECT id, recorded_at, state, run FROM test_runs WHERE session_id = ? "
            "ORDER BY id DESC LIMIT ?",
            (session_id, RUNS_SHOWN),
        ).fetchall()
    finally:
        conn.close()
    return [_run(*row) for row in reversed(rows)]


def _run(run_id: int, recorded_at: int, state: str, raw: str) -> dict[str, Any]:
    try:
        run = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        run = {}
    cases = [c for c in run.get("cases") or [] if isinstance(c, dict)]
    counts = {k: sum(1 for c in cases if c.get("outcome") == k) for k in OUTCOMES}
    failing = [c for c in cases if c.get("outcome") in ("failed", "error")]
    exit_code = run.get("exit_code")
    green = exit_code == 0 and not failing and counts["passed"] > 0
    return {
        "id": run_id,
        "timestamp": recorded_at,
        "state": state,
        "exit_code": exit_code,
        "duration_s": run.get("duration_s"),
        "green": green,
        "counts": counts,
        "failing": [
            {
                "id": c.get("id") or c.get("file") or "",
                "outcome": c.get("outcome"),
                "message": c.get("message") or "",
            }
            for c in failing[:FAILURES_SHOWN]
        ],
        "more_failing": max(0, len(failing) - FAILURES_SHOWN),
    }


def reviews(state: Path, session_id: str) -> list[dict[str, Any]]:
    """The session's merge decisions, oldest first: approved (with the commit that took
    the change, when one did), rejected, or withdrawn as overlapping the person's own
    edits; each with the diff its entry kept."""
    decided: list[dict[str, Any]] = []
    for kind in ("merge_approved", "merge_rejected", "merge_overlap"):
        chosen = Filters(session=session_id, event_type=kind, limit=REVIEWS_SHOWN)
        decided += entries(state, chosen)
    decided = sorted(decided, key=lambda e: int(e["id"]))[-REVIEWS_SHOWN:]
    commits = [
        (int(e["id"]), sha, e)
        for e in entries(
            state,
            Filters(session=session_id, event_type="tool_result", tool="git.commit", limit=200),
        )
        if (sha := commit_of(e))
    ]
    approvals = [int(e["id"]) for e in decided if e["event_type"] == "merge_approved"]
    kept = _kept_diffs(state, session_id, min((int(e["id"]) for e in decided), default=0))
    shown: list[dict[str, Any]] = []
    for entry in decided:
        seq = int(entry["id"])
        commit = None
        if entry["event_type"] == "merge_approved":  # its commit comes before the next one
            until = next((later for later in approvals if later > seq), None)
            commit = next(
                ({"sha": sha, "entry": at, "message": _message(e)}
                 for at, sha, e in commits if seq < at and (until is None or at < until)),
                None,
            )  # fmt: skip
        meta = entry["metadata"] if isinstance(entry.get("metadata"), dict) else {}
        diff, state_of = _diff(entry, meta, kept.get(seq))
        shown.append(
            {
                "id": entry["id"],
                "timestamp": entry.get("timestamp"),
                "kind": str(entry["event_type"]).removeprefix("merge_"),
                "summary": entry.get("input_summary") or "",
                "by": meta.get("by", ""),
                "files": [f for f in str(meta.get("files") or "").split(",") if f],
                "diff": diff[:DIFF_SHOWN],
                "kept": state_of,
                "cut": state_of != "whole" or len(diff) > DIFF_SHOWN,
                "commit": commit,
            }
        )
    return shown


def _kept_diffs(state: Path, session_id: str, first: int) -> dict[int, str]:
    """The session's kept diffs from audit entry ``first`` on, read in one query."""
    if not first:
        return {}
    conn = connect_ro(db_path(state))
    try:
        rows = conn.execute(
            "SELECT audit_seq, diff FROM review_diffs WHERE session_id = ? AND audit_seq >= ?",
            (session_id, first),
        ).fetchall()
    except sqlite3.OperationalError:  # a log from before diffs were kept
        rows = []
    finally:
        conn.close()
    return {int(seq): str(diff) for seq, diff in rows}


def _diff(entry: dict[str, Any], meta: dict[str, Any], kept: str | None) -> tuple[str, str]:
    """The decided diff kept beside ``entry`` when it is the one the entry's SHA-256
    names (``whole``), else the entry's own preview: none was kept (``preview``), or the
    one kept was changed after the decision (``altered``)."""
    preview = str(entry.get("output_summary") or "")
    if kept is None:
        return preview, "preview"
    if str(meta.get("diff_sha256") or "") != hashlib.sha256(kept.encode()).hexdigest():
        return preview, "altered"
    return kept, "whole"


def commit_of(entry: dict[str, Any]) -> str | None:
    """The commit a ``git.commit`` result names (its summary may be cut: read by pattern)."""
    tool = entry.get("syscall_type") or entry.get("tool_name")  # the kernel writes the first
    if tool != "git.commit" or entry.get("policy_decision") == "denied":
        return None
    found = _SHA.search(str(entry.get("output_summary") or ""))
    return found.group(1) if found else None


def _message(entry: dict[str, Any]) -> str:
    try:
        called = msgspec.json.decode(str(entry.get("input_summary") or ""))
    except msgspec.DecodeError:
        return ""
    return str(called.get("message") or "") if isinstance(called, dict) else ""
