"""The tech-debt budget (ADR-042) and the coverage baseline it is measured against.

A change's line coverage is compared with the baseline: explore commits are locked out
past the lockout threshold (and explore mode locked until a strict commit restores
coverage); any other change below ``min_delta`` gets a notice.  Strict commits move the
baseline: the kernel writes the project's baseline file (when the project has fluffy's
folder) and keeps a copy in its state database.

:class:`CoverageBudget` is :class:`~fluffy.kernel.workflow.machine.Workflow`'s
collaborator: its callers hold the workflow's lock, and it reads the workflow's current
tech-debt settings (a policy reload replaces them).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Protocol

from fluffy.errors import FluffyError, TransitionDenied
from fluffy.kernel.policy.tdd_settings import TechDebtSettings
from fluffy.kernel.workflow.baseline import read_baseline, write_baseline
from fluffy.kernel.workflow.coverage import CoverageReport, judge_budget
from fluffy.kernel.workflow.evidence import TestRun
from fluffy.kernel.workflow.states import ON_FAIL
from fluffy.kernel.workflow.store import SessionRow, WorkflowStore

BASELINE_KEY = "coverage_baseline"
LOCK_KEY = "explore_locked"
#: Set once a JavaScript project was told that its coverage is not recorded.
NO_JS_COVERAGE_KEY = "javascript_coverage_noted"
NO_JS_COVERAGE = (
    "fluffy records no coverage of a JavaScript project's tests, so the tech-debt budget "
    "is not checked (said once; a tests.command in .fluffy/config.yaml that writes "
    "coverage to {coverage} turns it on)"
)


class Host(Protocol):
    """What the budget needs of the workflow that holds it."""

    store: WorkflowStore
    project: Path
    tech_debt: TechDebtSettings
    #: the project's language: fluffy records coverage of Python tests only
    language: str

    async def latest_run(
        self, session: SessionRow
    ) -> tuple[int, TestRun, CoverageReport | None] | None: ...


class CoverageBudget:
    """The coverage budget of one workflow's sessions (callers hold its lock)."""

    def __init__(self, workflow: Host) -> None:
        self.workflow = workflow

    async def baseline(self) -> tuple[CoverageReport | None, list[str]]:
        """The coverage baseline (the project's baseline file) and notes on what is wrong
        with it (missing, corrupt, changed since the kernel wrote it)."""
        cached = await self.workflow.store.get_meta(BASELINE_KEY)
        if not self.baseline_file_here():  # fluffy's state holds it (no .fluffy/ here)
            return (CoverageReport.from_dict(_json(cached)) if cached else None), []
        return await asyncio.to_thread(
            read_baseline, self.workflow.project, self.workflow.tech_debt.baseline_file, cached
        )

    def baseline_file_here(self) -> bool:
        """Whether the baseline is a file in the project: only in one that has fluffy's
        folder (``fluffy init``).  A project fluffy runs on with its defaults gets no
        .fluffy/ written into it; its baseline stays in fluffy's state database."""
        return (self.workflow.project / ".fluffy").is_dir()

    async def check(self, session: SessionRow, *, automatic: bool = False) -> list[str]:
        """The tech-debt budget of the session's change: explore commits are locked out
        past the lockout threshold; any other change below min_delta gets a notice.  An
        ``automatic`` merge of a non-strict change with no coverage recorded is refused:
        the budget cannot be checked, so a person decides."""
        latest = await self.workflow.latest_run(session)
        current = latest[2] if latest else None
        if current is None and automatic and session.mode != "strict":
            raise TransitionDenied(
                f"no coverage was recorded for this {session.mode}-mode change, so its "
                "tech-debt budget cannot be checked; it does not merge on its own",
                why="the green run wrote no coverage report: a tests.command in "
                ".fluffy/config.yaml that does not write {coverage}, or code under test "
                "that ended the test process before coverage could write it",
                fix="Look at the change and approve it yourself (/approve); with your own "
                "tests.command, make it write {coverage}; or switch to strict mode "
                "(/strict).",
            )
        if current is None and self.workflow.language == "javascript":
            return await self._javascript_note()  # none is recorded: said once, not each time
        if current is None:
            return [f"no coverage was recorded for this {session.mode} commit; the budget "
                    "was not checked"]  # fmt: skip
        baseline, notes = await self.baseline()
        settings = self.workflow.tech_debt
        verdict = judge_budget(
            baseline,
            current,
            min_delta=settings.min_delta,
            warning_threshold=settings.warning_threshold,
            lockout_threshold=settings.lockout_threshold,
        )
        if session.mode == "strict":  # tests came first: a notice, never a lock
            if verdict.ok:
                return notes
            return [*notes, f"{verdict.message.split(':')[0]}: below min_delta "
                    f"({settings.min_delta:g} points) in a strict-mode change; commit "
                    "allowed, with this notice on record"]  # fmt: skip
        if verdict.level == "lock":
            await self.workflow.store.set_meta(
                LOCK_KEY, _dumps(baseline.to_dict()) if baseline else ""
            )
            raise TransitionDenied(
                ON_FAIL["approved_within_budget"],
                why=verdict.message,
                fix="Switch to strict mode (/strict) and write tests that restore coverage.",
            )
        return [*notes, *([] if verdict.ok else [verdict.message])]

    async def _javascript_note(self) -> list[str]:
        """That a JavaScript project's coverage is not recorded: the first time only."""
        if await self.workflow.store.get_meta(NO_JS_COVERAGE_KEY) is not None:
            return []
        await self.workflow.store.set_meta(NO_JS_COVERAGE_KEY, "1")
        return [NO_JS_COVERAGE]

    async def after_commit(self, session: SessionRow) -> list[str]:
        """Strict commits move the coverage baseline (and lift an explore lock they
        restore): the kernel writes the baseline file, and keeps a copy in its database."""
        if session.mode != "strict" or session.data.exemption is not None:
            return []
        latest = await self.workflow.latest_run(session)
        if latest is None or latest[2] is None:
            return []
        current = latest[2]
        locked = await self.workflow.store.get_meta(LOCK_KEY)
        if locked is not None:
            before = CoverageReport.from_dict(_json(locked)) if locked else None
            if before is None or current.percent >= before.percent:
                await self.workflow.store.delete_meta(LOCK_KEY)
        rel = self.workflow.tech_debt.baseline_file
        notes: list[str] = []
        try:
            if self.baseline_file_here():
                await asyncio.to_thread(
                    write_baseline, self.workflow.project, rel, current, session.id
                )
        except (OSError, FluffyError) as exc:  # the commit stands; the budget notes it later
            notes.append(f"cannot write the coverage baseline file {rel}: {exc}")
        await self.workflow.store.set_meta(BASELINE_KEY, _dumps(current.to_dict()))
        return notes


def _json(raw: str) -> Any:

    return json.loads(raw)


def _dumps(value: Any) -> str:

    return json.dumps(value, sort_keys=True)
