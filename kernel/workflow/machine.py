"""The TDD state machine (design: State Machine Module), driven only by kernel facts.

:class:`Workflow` moves sessions along the tables of :mod:`~fluffy.kernel.workflow.states`.
Guards read evidence the kernel recorded itself (:meth:`Workflow.record_test_run`: a
:class:`~fluffy.kernel.workflow.evidence.TestRun` the kernel executed) and the project
tree; never what the AI says (:mod:`~fluffy.kernel.workflow.guards`).  A failed guard
raises :class:`TransitionDenied` with the design's ``on_fail`` text as *what*, the
evidence's reason as *why*, and a fix.  TDD exemptions are requested and decided in
:mod:`~fluffy.kernel.workflow.exemption_requests`; the tech-debt budget is
:mod:`~fluffy.kernel.workflow.budget`'s.

Every transition is persisted (chained state log) and audited (``state_transition``,
written synchronously).  Mode changes go through the policy engine
(``session.set_mode``): debug always needs review, a denial falls back to strict, and a
tech-debt lock blocks explore.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, Unpack

import msgspec
from msgspec.structs import replace

from fluffy.errors import ModeDenied, SessionNotFound, TransitionDenied
from fluffy.kernel.audit.entry import Event, now_ms
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.policy.engine import Caller, Decision, Request
from fluffy.kernel.policy.tdd_settings import DEFAULT_EXEMPTIONS, ExemptionRule, TechDebtSettings
from fluffy.kernel.workflow.budget import LOCK_KEY, CoverageBudget
from fluffy.kernel.workflow.coverage import CoverageReport
from fluffy.kernel.workflow.evidence import (
    DEFAULT_TEST_GLOBS,
    MissingProof,
    Overlay,
    TestRun,
    TreeSnapshot,
    snapshot_trees,
)
from fluffy.kernel.workflow.exemption_requests import ExemptionRequests
from fluffy.kernel.workflow.guards import Guards
from fluffy.kernel.workflow.sessiondata import DataChange, SessionData, changed
from fluffy.kernel.workflow.states import (
    EVENTS,
    MODES,
    Mode,
    flow_of,
    is_mode,
    next_state,
)
from fluffy.kernel.workflow.store import Outcome, SessionRow, WorkflowStore


class Evaluator(Protocol):
    """The policy engine, or the kernel's audited front of it."""

    def evaluate(self, request: Request) -> Decision: ...


class Workflow:
    def __init__(
        self,
        store: WorkflowStore,
        project: Path,
        *,
        audit: AuditLog | None = None,
        policy: Evaluator | None = None,
        exemptions: Mapping[str, ExemptionRule] = DEFAULT_EXEMPTIONS,
        tech_debt: TechDebtSettings | None = None,
        test_globs: Sequence[str] = DEFAULT_TEST_GLOBS,
        on_session_end: Callable[[], Awaitable[object]] | None = None,
        overlay: Callable[[str], Overlay] | None = None,
        missing_code: Callable[[str], MissingProof] | None = None,
        language: str = "python",
    ) -> None:
        self.store = store
        self.project = project
        #: the project's language ("python", "javascript"): what its test runs record
        self.language = language
        self.audit = audit
        self.policy = policy
        self.exemptions = exemptions
        self.tech_debt = tech_debt or TechDebtSettings()
        self.test_globs = tuple(test_globs)
        #: session id -> its staged changes: guards judge the tree the tools see
        self.overlay = overlay
        #: session id -> the tree check of natural red (:mod:`.missing`); None: asserts only
        self.missing_code = missing_code
        self.on_session_end = on_session_end  # e.g. a database backup (design: SQLite Corruption)
        # one operation at a time: each reads a session, awaits, and writes it back chained
        self.lock = asyncio.Lock()
        #: (session id, mode, state) of the newest change, for the audit entries of calls
        self.current: tuple[str | None, str, str] = (None, "strict", "idle")
        #: exemption requests, held and decided (called with the lock held)
        self.requests = ExemptionRequests(self)
        #: the tech-debt budget and the coverage baseline it is measured against
        self.budget = CoverageBudget(self)
        #: the checks a transition must pass, on kernel facts only
        self.guards = Guards(self)

    # -- sessions -----------------------------------------------------------------------
    async def new_session(
        self, mode: Mode = "strict", caller: Caller | None = None, *, approved: bool = False
    ) -> SessionRow:
        async with self.lock:
            now = now_ms()
            session = SessionRow(uuid.uuid4().hex[:12], now, now, "strict", "idle")
            await self.record_step(session, "session_created", "idle", {})
        if mode != "strict":
            outcome = await self.set_mode(
                session.id, mode, caller or Caller("user"), approved=approved
            )
            return outcome.session
        return session

    async def get(self, session_id: str) -> SessionRow:
        session = await self.store.load(session_id)
        if session is None:
            raise SessionNotFound(
                f"no session {session_id!r}", why="the state database has no session with that id"
            )
        return session

    async def record_step(
        self, session: SessionRow, event: str, from_state: str, note: dict[str, Any]
    ) -> None:
        """Save ``session`` as changed by ``event`` (chained in the state log) and audit
        it; the collaborators (exemption requests) record their steps here too."""
        await self.store.save(session, event, from_state, note)
        self.current = (session.id, session.mode, session.state)
        if self.audit is not None:
            await self.audit.record(
                Event(
                    "session_mode_change" if event == "set_mode" else "state_transition",
                    caller="kernel",
                    session_id=session.id,
                    session_mode=session.mode,
                    state_machine_state=session.state,
                    input_summary=f"{event}: {from_state} -> {session.state} ({session.mode})",
                    metadata={k: str(v) for k, v in note.items()},
                )
            )

    # -- evidence -------------------------------------------------------------------------
    async def _record_test_run_unlocked(
        self, session_id: str, run: TestRun, coverage: CoverageReport | None = None
    ) -> int:
        """Record a run the kernel executed (the only evidence the guards read)."""
        session = await self.get(session_id)
        run_id = await self.store.add_test_run(
            session.id,
            session.state,
            session.mode,
            run.to_dict(),
            None if coverage is None else coverage.to_dict(),
        )
        if self.audit is not None:  # the evidence the guards read, on the audit record too
            outcomes = collections.Counter(case.outcome for case in run.cases)
            counts = ", ".join(f"{n} {kind}" for kind, n in sorted(outcomes.items()))
            await self.audit.record(
                Event(
                    "test_run_recorded",
                    caller="kernel",
                    session_id=session.id,
                    session_mode=session.mode,
                    state_machine_state=session.state,
                    input_summary=f"test run {run_id}: exit {run.exit_code}; "
                    f"{counts or 'no test cases'}",
                    metadata={
                        "run_id": str(run_id),
                        "exit_code": str(run.exit_code),
                        "cases": str(len(run.cases)),
                        "coverage": "" if coverage is None else f"{coverage.percent:.2f}",
                    },
                )
            )
        return run_id

    async def latest_run(
        self, session: SessionRow
    ) -> tuple[int, TestRun, CoverageReport | None] | None:
        """The session's newest recorded test run (id, run, coverage), checked against
        its digest in the chained state log; None before any run."""
        found = await self.store.latest_run(session.id)
        if found is None:
            return None
        run_id, run, coverage = found
        report = CoverageReport.from_dict(coverage) if coverage else None
        return run_id, TestRun.from_dict(run), report

    def overlay_of(self, session_id: str) -> Overlay | None:
        return self.overlay(session_id) if self.overlay is not None else None

    def proof(self, session_id: str) -> MissingProof | None:
        """The natural-red tree check for the session's view (None: not configured)."""
        return self.missing_code(session_id) if self.missing_code is not None else None

    async def red_verdict(self, session_id: str, run: TestRun) -> tuple[bool, str]:
        """Whether ``run`` is red for the session's test_writing, and the one sentence
        saying why (or what would be) -- the guard's own judgement."""
        session = await self.get(session_id)
        base = TreeSnapshot(session.data.tests_base or {})
        proves = self.proof(session_id)
        return run.is_red(base, proves), run.red_reason(base, proves)

    def snapshot(self, session_id: str) -> tuple[TreeSnapshot, TreeSnapshot]:
        """(tests, sources) of the project as the session's tools see it."""
        return snapshot_trees(self.project, self.test_globs, self.overlay_of(session_id))

    # -- transitions ----------------------------------------------------------------------
    async def _fire_unlocked(
        self,
        session_id: str,
        event: str,
        *,
        approved: bool | None = None,
        by: str | None = None,
    ) -> Outcome:
        if event not in EVENTS:
            raise TransitionDenied(
                f"unknown workflow event {event!r}", fix=f"Use one of: {', '.join(EVENTS)}."
            )
        session = await self.get(session_id)
        state = session.state
        flow = flow_of(session.mode, session.data.exemption is not None)
        transition = next_state(flow, state, event)
        if transition is None:
            raise TransitionDenied(
                f"{event} is not possible in {state} ({flow} flow)",
                why="the design's transition table has no such step",
                fix="Use /status to see the state; /cancel returns to idle.",
            )
        if event == "merge_approved":
            approval = msgspec.structs.replace(session.data, merge_approved=bool(approved))
            session = replace(session, data=approval)
        warnings = await self.guards.check(transition.guard, session) if transition.guard else []
        data, notes = await self._entering(session, transition.to, event)
        warnings += notes
        updated = replace(session, state=transition.to, data=data, updated_at=now_ms())
        note: dict[str, Any] = {"warnings": warnings} if warnings else {}
        if by is not None:  # who decided (e.g. the user's choice at a review)
            note["by"] = by
        await self.record_step(updated, event, state, note)
        if transition.to == "idle" and state != "idle" and self.on_session_end is not None:
            await self.on_session_end()
        return Outcome(updated, state, event, warnings)

    async def entering(self, session: SessionRow, target: str, event: str) -> SessionData:
        """The session data after entering ``target`` (baselines for the next guards)."""
        data, _ = await self._entering(session, target, event)
        return data

    async def _entering(
        self, session: SessionRow, target: str, event: str
    ) -> tuple[SessionData, list[str]]:
        """The session data after entering ``target``, and the coverage baseline's notes
        when a commit ends the session's task."""
        data = session.data
        change: dict[str, Any] = {
            # guards need a run newer than this one
            "runs_since": await self.store.latest_run_id(session.id),
        }
        if target != "committing":
            change["merge_approved"] = False
        if target == "reviewing":  # an approval is for one review, never a later one
            change["merge_started"] = None
        wants_tests = target in ("test_writing", "retroactive_testing") or (
            event == "exemption_granted"  # the exemption's scope covers tests too
        )
        wants_sources = target in ("code_writing", "exploring")
        if wants_tests or wants_sources:
            tests, sources = self.snapshot(session.id)  # one walk of the tree
            if wants_tests:
                change["tests_base"] = dict(tests.files)
            if wants_sources:
                change["sources_base"] = dict(sources.files)
        if target == "committing" and session.mode != "strict" and data.exemption is None:
            change["unverified"] = True
        notes: list[str] = []
        if target == "idle":
            if event == "commit_complete":
                notes = await self.budget.after_commit(session)
            change.update(exemption=None, exemption_pending=None, tests_base=None,
                          sources_base=None, runs_since=0, unverified=False)  # fmt: skip
        return msgspec.structs.replace(data, **change), notes

    async def baseline(self) -> tuple[CoverageReport | None, list[str]]:
        """The coverage baseline (the project's baseline file) and notes on what is wrong
        with it (missing, corrupt, changed since the kernel wrote it)."""
        return await self.budget.baseline()

    async def check_budget(self, session_id: str, *, automatic: bool = False) -> list[str]:
        """The budget check, asked *before* a merge writes the project (explore commits:
        TransitionDenied when the budget locks, or when an ``automatic`` merge has no
        coverage to check; else notices, strict changes too)."""
        async with self.lock:
            session = await self.get(session_id)
            if session.data.exemption is not None:  # an exemption spends no budget
                return []
            return await self.budget.check(session, automatic=automatic)

    async def annotate(
        self, session_id: str, note: str, **values: Unpack[DataChange]
    ) -> SessionRow:
        """Keep ``values`` in the session's data (chained like a transition; no state change).

        ``None`` puts a field back to its default.  The tool path records here what must
        survive a crash (e.g. that a merge was approved and started).
        """
        async with self.lock:
            session = await self.get(session_id)
            data = changed(session.data, values)
            updated = replace(session, data=data, updated_at=now_ms())
            await self.record_step(updated, note, session.state, {})
            return updated

    async def cancel(self, session_id: str) -> Outcome:
        return await self.fire(session_id, "cancel")

    # -- the serialised entry points ----------------------------------------------------------
    async def fire(
        self,
        session_id: str,
        event: str,
        *,
        approved: bool | None = None,
        by: str | None = None,
    ) -> Outcome:
        async with self.lock:
            return await self._fire_unlocked(session_id, event, approved=approved, by=by)

    async def record_test_run(
        self, session_id: str, run: TestRun, coverage: CoverageReport | None = None
    ) -> int:
        """Record a run the kernel executed (the only evidence the guards read)."""
        async with self.lock:
            return await self._record_test_run_unlocked(session_id, run, coverage)

    async def request_exemption(
        self,
        session_id: str,
        category: str,
        paths: Sequence[str],
        reason: str,
        *,
        by: str = "user",
    ) -> Outcome:
        """The user's own request: granted at once when the category's globs cover it."""
        async with self.lock:
            return await self.requests.grant(session_id, category, paths, reason, by=by)

    async def hold_exemption(
        self, session_id: str, category: str, paths: Sequence[str], reason: str
    ) -> SessionRow:
        """The AI's request: checked, audited and held for the user's decision
        (:meth:`decide_exemption`); never granted here.

        One request waits at a time (ExemptionPending while another does), and each held
        request has an id, recorded and shown to the user, that the decision must name.
        """
        async with self.lock:
            return await self.requests.hold(session_id, category, paths, reason)

    async def decide_exemption(
        self,
        session_id: str,
        grant: bool,
        *,
        request_id: str,
        by: str = "user",
        why: str = "",
    ) -> Outcome:
        """The user's decision on the AI's held request ``request_id`` (the one they were
        shown): ExemptionMismatch when the request that waits is another one."""
        async with self.lock:
            return await self.requests.decide(
                session_id, grant, request_id=request_id, by=by, why=why
            )

    async def set_mode(
        self, session_id: str, mode: str, caller: Caller, *, approved: bool = False
    ) -> Outcome:
        """``session.set_mode``: always through the policy engine; a denial falls back to strict."""
        async with self.lock:
            return await self._set_mode_unlocked(session_id, mode, caller, approved=approved)

    # -- modes ------------------------------------------------------------------------------
    async def _set_mode_unlocked(
        self, session_id: str, mode: str, caller: Caller, *, approved: bool = False
    ) -> Outcome:
        """``session.set_mode``: always through the policy engine; a denial falls back to strict."""
        if not is_mode(mode):
            raise ModeDenied(f"unknown mode {mode!r}", fix=f"Use one of: {', '.join(MODES)}.")
        session = await self.get(session_id)
        if session.state not in ("idle", "planning"):
            raise ModeDenied(
                f"the mode cannot change in {session.state}",
                why="a flow in progress would lose its guarantees",
                fix="/cancel first, then change mode.",
            )
        reason = await self._mode_refusal(session, mode, caller, approved)
        target = "strict" if reason else mode
        updated = replace(session, mode=target, updated_at=now_ms())
        await self.record_step(
            updated, "set_mode", session.state, {"asked": mode, "refused": reason or ""}
        )
        if reason:
            raise ModeDenied(
                f"mode {mode} refused; the session is in strict mode",
                why=reason,
                fix="Stay in strict mode, or ask the person to switch (/explore or /debug at the "
                "prompt).",
            )
        return Outcome(updated, session.state, "set_mode")

    async def _mode_refusal(
        self, session: SessionRow, mode: Mode, caller: Caller, approved: bool
    ) -> str | None:
        if mode == "strict":
            return None
        if await self.store.get_meta(LOCK_KEY) is not None:
            return "explore mode is locked: coverage fell past the tech-debt lockout threshold"
        if self.policy is None:
            return "no policy is loaded (default deny)"
        decision = self.policy.evaluate(
            Request("session.set_mode", caller, state=session.state, mode=mode)
        )
        if decision.result == "deny":
            said = "; ".join(decision.reasons) or "the policy denies session.set_mode"
            if decision.decided_by is None:  # default deny: say which rule would allow it
                said += (
                    "; a rule such as `{name: person-switches-modes, match: {syscall: "
                    "session.set_mode, caller_tag: [person]}, action: allow}` in "
                    ".fluffy/policy.yaml lets you switch (fluffy's default policy has it)"
                )
            return said
        needs_review = decision.result == "require_review" or mode == "debug"
        if needs_review and not approved:
            return f"{mode} mode requires review and was not approved"
        return None
