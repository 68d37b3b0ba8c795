"""What a session's page reads from the state database beside its timeline: the test
runs (red or green, each failing test and message) and the reviews (the diff decided on,
the commit that took it), from a real database written by the kernel's own stores."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path

import pytest

from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.workflow.store import WorkflowStore
from fluffy.ui import records
from fluffy.ui.records import FAILURES_SHOWN, reviews

pytestmark = pytest.mark.unit

SHA = "0123456789abcdef0123456789abcdef01234567"
DIFF = "--- a/src/m.py\n+++ b/src/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
#: A diff longer than an audit entry keeps (its summary holds 500 characters).
LONG = "--- a/big.py\n+++ b/big.py\n@@ -0,0 +1,400 @@\n" + "".join(
    f"+line_{i} = {i}\n" for i in range(400)
)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def case(name: str, outcome: str, message: str = "") -> dict[str, object]:
    return {"id": f"tests/test_m.py::{name}", "file": "tests/test_m.py", "outcome": outcome,
            "message": message, "origin": "", "assertion": outcome == "failed"}  # fmt: skip


async def _write(state: Path) -> None:
    store = await WorkflowStore.open(state)
    red = {"exit_code": 1, "duration_s": 0.2, "cases": [
        case("test_new", "failed", "AssertionError: assert 1 == 2"),
        case("test_old", "passed"),
        *(case(f"test_{i}", "error", f"boom {i}") for i in range(FAILURES_SHOWN + 3)),
    ]}  # fmt: skip
    green = {"exit_code": 0, "cases": [case("test_new", "passed"), case("test_old", "passed")]}
    await store.add_test_run("s1", "test_writing", "strict", red, None)
    await store.add_test_run("s1", "code_writing", "strict", green, None)
    await store.add_test_run("s2", "code_writing", "strict", green, None)
    audit = await AuditLog.open(state)
    try:
        await audit.record(Event("kernel_start"))
        for kind, session, diff, meta in (
            ("merge_rejected", "s1", DIFF, {}),
            ("merge_approved", "s1", LONG, {"by": "user", "files": "src/m.py,b.py"}),
            ("merge_approved", "s1", DIFF, {"by": "auto-merge", "files": "src/m.py"}),
            ("merge_approved", "s2", DIFF, {}),
        ):
            if kind == "merge_approved" and session == "s1" and diff == DIFF:
                for event in (  # the commit of the approval before
                    Event("tool_result", session_id="s1", syscall_type="git.commit",
                          policy_decision="denied",
                          output_summary=f'{{"code": "x", "commit": "{"f" * 40}"}}'),
                    Event("tool_result", session_id="s1", syscall_type="git.commit",
                          policy_decision="allowed", input_summary='{"message": "Add m"}',
                          output_summary=f'{{"commit": "{SHA}", "ref": "refs/heads/main", "fil'),
                ):  # fmt: skip
                    await audit.record(event)
            # as the kernel's merge flow writes them: a preview and the SHA-256 in the
            # entry, the whole diff beside it
            seq = await audit.record(
                Event(kind, session_id=session, output_summary=diff,
                      metadata={**meta, "diff_sha256": sha(diff)})
            )  # fmt: skip
            await store.keep_diff(seq, session, diff)
    finally:
        await audit.close()
        await store.close()


def test_a_session_s_runs_and_reviews_are_read_from_its_database(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert records.test_runs(state, "s1") == [] and reviews(state, "s1") == []  # nothing yet
    asyncio.run(_write(state))

    red, green = records.test_runs(state, "s1")
    assert not red["green"] and red["state"] == "test_writing" and red["exit_code"] == 1
    assert red["counts"] == {"passed": 1, "failed": 1, "error": FAILURES_SHOWN + 3, "skipped": 0}
    assert red["failing"][0] == {"id": "tests/test_m.py::test_new", "outcome": "failed",
                                 "message": "AssertionError: assert 1 == 2"}  # fmt: skip
    assert len(red["failing"]) == FAILURES_SHOWN and red["more_failing"] == 4
    assert green["green"] and green["counts"]["passed"] == 2 and green["failing"] == []

    rejected, approved, again = reviews(state, "s1")
    assert rejected["kind"] == "rejected" and rejected["diff"] == DIFF
    assert rejected["commit"] is None and rejected["kept"] == "whole"
    # the whole diff, though the audit entry kept 500 characters of it
    assert approved["diff"] == LONG and approved["kept"] == "whole" and not approved["cut"]
    # the allowed git.commit after the approval is its commit (its summary cut and all);
    # the denied one is not
    assert approved["commit"] is not None and approved["commit"]["sha"] == SHA
    assert approved["commit"]["message"] == "Add m"
    assert approved["by"] == "user" and approved["files"] == ["src/m.py", "b.py"]
    assert again["by"] == "auto-merge" and again["commit"] is None  # not committed yet
    assert [r["kind"] for r in reviews(state, "s2")] == ["approved"]  # its own only


def test_a_kept_diff_changed_after_the_decision_is_not_shown_as_decided(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    asyncio.run(_write(state))
    db = sqlite3.connect(state / "fluffy.db")
    db.execute("UPDATE review_diffs SET diff = replace(diff, 'line_7 = 7', 'line_7 = 8')")
    db.commit()
    db.close()
    _, approved, _ = reviews(state, "s1")
    assert approved["kept"] == "altered" and approved["cut"]
    assert "line_7 = 8" not in approved["diff"]  # the entry's own preview instead
    assert approved["diff"].startswith("--- a/big.py") and len(approved["diff"]) <= 500
