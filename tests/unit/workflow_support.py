"""Helpers for the workflow tests: a project on disk, a Workflow on a real database."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fluffy.junit import TestCase
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.policy.engine import PolicyEngine
from fluffy.kernel.policy.model import parse_policy
from fluffy.kernel.workflow.evidence import TestRun, snapshot_trees
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.store import WorkflowStore

T = TypeVar("T")

POLICY = """
capabilities:
  - name: explore-ok
    match: {syscall: session.set_mode, session_mode: [explore]}
    action: allow
  - name: debug-reviewed
    match: {syscall: session.set_mode, session_mode: [debug]}
    action: require_review
    reason: debug mode runs containers
"""


def make_project(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "tests" / "test_calc.py").write_text(
        "from src.calc import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    return root


def fake_run(
    root: Path, cases: list[tuple[str, str, bool]], exit_code: int | None = None
) -> TestRun:
    """A run of the current tree with the given (test id, outcome, assertion) results.

    Used where a real pytest run would only slow the test down; the tree hashes are real.
    """
    tests, sources = snapshot_trees(root)
    built = tuple(
        TestCase(
            id=id_,
            file=id_.split("::")[0],
            outcome=outcome,
            assertion=assertion,  # type: ignore[arg-type]
            message="assert 1 == 2" if assertion else "",
        )
        for id_, outcome, assertion in cases
    )
    failed = any(c.outcome in ("failed", "error") for c in built)
    code = exit_code if exit_code is not None else (1 if failed else 0 if built else 5)
    return TestRun(("pytest",), code, built, tests, sources, time.time(), 0.1)


@dataclass
class Kit:
    workflow: Workflow
    store: WorkflowStore
    audit: AuditLog

    async def close(self) -> None:
        await self.store.close()
        await self.audit.close()


async def open_kit(state: Path, project: Path, policy: str = POLICY, **options: Any) -> Kit:
    audit = await AuditLog.open(state)
    if audit.empty:
        await audit.record(Event("kernel_start"))
    store = await WorkflowStore.open(state)
    engine = PolicyEngine(parse_policy(policy, "test-policy"))
    workflow = Workflow(store, project, audit=audit, policy=engine, **options)
    return Kit(workflow, store, audit)
