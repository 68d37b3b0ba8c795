"""The guards of the TDD state machine's transitions (design: State Machine Module).

A guard reads only what the kernel recorded itself (test runs it executed, the tree as
the session's tools see it), never what the AI says.  A failed guard raises
:class:`~fluffy.errors.TransitionDenied` with the design's ``on_fail`` text as *what*, the
evidence's reason as *why*, and a fix.

:class:`Guards` is :class:`~fluffy.kernel.workflow.machine.Workflow`'s collaborator: it runs
with the workflow's lock held by its caller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from fluffy.errors import TransitionDenied
from fluffy.kernel.workflow.budget import CoverageBudget
from fluffy.kernel.workflow.coverage import CoverageReport
from fluffy.kernel.workflow.evidence import MissingProof, Overlay, TestRun, TreeSnapshot
from fluffy.kernel.workflow.states import ON_FAIL
from fluffy.kernel.workflow.store import SessionRow
from fluffy.pathnames import shown


class Host(Protocol):
    """What the guards need of the workflow that holds them."""

    project: Path
    test_globs: tuple[str, ...]
    budget: CoverageBudget

    def overlay_of(self, session_id: str) -> Overlay | None: ...

    def proof(self, session_id: str) -> MissingProof | None: ...

    def snapshot(self, session_id: str) -> tuple[TreeSnapshot, TreeSnapshot]: ...

    async def latest_run(
        self, session: SessionRow
    ) -> tuple[int, TestRun, CoverageReport | None] | None: ...


class Guards:
    """The transition guards of one workflow (callers hold its lock)."""

    def __init__(self, workflow: Host) -> None:
        self.workflow = workflow

    async def check(self, name: str, session: SessionRow) -> list[str]:
        """Check ``name``; raise TransitionDenied, or return warnings."""
        what = ON_FAIL[name]
        data = session.data
        if name in ("approved", "approved_within_budget"):
            if not data.merge_approved:
                raise TransitionDenied(
                    what, why="nobody approved the merge", fix="Approve it with /approve."
                )
            if name == "approved_within_budget" and data.exemption is None:
                return await self.workflow.budget.check(session)
            return []
        if name in ("code_changed", "tests_changed"):
            tests, sources = self.workflow.snapshot(session.id)
            tested = name == "tests_changed"
            snapshot, tree = (data.tests_base, tests) if tested else (data.sources_base, sources)
            if snapshot is None:
                raise TransitionDenied(
                    what,
                    why="this state has no snapshot of the tree to compare with",
                    fix="/cancel and start the flow again.",
                )
            base = TreeSnapshot(snapshot)
            exemption = data.exemption
            if exemption is not None:  # an exemption covers its paths and nothing else
                changed = tree.changed_since(base) | tests.changed_since(
                    TreeSnapshot(data.tests_base or {})
                )
                outside = sorted(changed - {shown(path) for path in exemption.paths})
                if outside:
                    raise TransitionDenied(
                        what,
                        why=f"the {exemption.category} exemption does not cover "
                        f"{', '.join(outside[:5])}",
                        fix="Undo those changes, or /cancel and follow the TDD flow.",
                    )
            if not tree.changed_since(base):
                raise TransitionDenied(
                    what,
                    why="no file changed since this state began",
                    fix="Make the change first (writes go through fs.write).",
                )
            return []
        latest = await self.workflow.latest_run(session)
        since = data.runs_since
        if latest is None or latest[0] <= since:
            raise TransitionDenied(
                what,
                why="no test run was recorded by the kernel in this state",
                fix="Run the tests with test.run.",
            )
        _, run, _ = latest
        if run.is_stale(
            self.workflow.project, self.workflow.test_globs, self.workflow.overlay_of(session.id)
        ):
            raise TransitionDenied(
                what,
                why="files changed since the latest test run, so it proves nothing now",
                fix="Run the tests again with test.run.",
            )
        if name == "red":
            base = TreeSnapshot(data.tests_base or {})
            proves = self.workflow.proof(session.id)
            if not run.is_red(base, proves):
                raise TransitionDenied(
                    what,
                    why=run.red_reason(base, proves),
                    fix="Write a test for the new behaviour and see it fail on an assertion "
                    "or on the code it needs.",
                )
        elif name == "green" and not run.is_green():
            raise TransitionDenied(
                what, why=_summary(run), fix="Fix the code until every test passes."
            )
        elif name == "green_or_no_tests" and not (run.is_green() or run.counts["found"] == 0):
            raise TransitionDenied(what, why=_summary(run), fix="Fix the code or the tests.")
        elif name == "failing" and run.is_green():
            raise TransitionDenied(what, why="the latest run passes", fix="Move on to review.")
        return []


def _summary(run: TestRun) -> str:
    counts = run.counts
    return (
        f"latest run: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['error']} errors (exit {run.exit_code})"
    )
