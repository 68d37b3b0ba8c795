"""How tool results move the TDD workflow (design: TDD Integration, Reviewing State).

The state machine's guards read only evidence the kernel recorded; this module decides
*when* to ask them, from what the tools just did:

- ``plan.complete`` → plan_complete;
- ``test.run`` in code_writing / exploring first tries code_changed (→ validating), in
  retroactive_testing tests_written; after the run, test_writing tries tests_red and
  validating goes to reviewing (tests_passed) or back (tests_failed);
- entering reviewing plans the merge: auto-merge when the tests pass, no sensitive
  path changed, the diff is under the limit and no policy rule asked for review;
  otherwise it waits for ``review.approve`` / ``review.reject`` from the user;
- approving merges (operation log, exactly once), then merge_approved → committing;
- ``git.commit`` merged into .git → commit_complete → idle.

A guard that does not hold is not an error here: the session stays where it is and the
result says why (the AI reads it and carries on).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import msgspec

from fluffy.errors import (
    MergeConflict,
    MergeOverlap,
    TransitionDenied,
    WorkflowError,
)
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.merge.landed import Change
from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.tools.changes.workspace import Workspaces
from fluffy.kernel.workflow.evidence import TestRun
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.states import flow_of

#: How much of a diff a result or an audit entry carries.
DIFF_PREVIEW = 20_000
#: How much of a decided diff is kept whole beside its audit entry (for the web view).
DIFF_KEPT = 2_000_000


class Step(msgspec.Struct):
    event: str
    source: str
    target: str | None
    why: str = ""
    #: what the step noted on the way (a coverage drop, a baseline file problem)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"event": self.event, "from": self.source}
        if self.target is not None:
            data["to"] = self.target
        if self.why:
            data["not_taken"] = self.why
        if self.notes:
            data["notes"] = list(self.notes)
        return data


def _changes(plan: Any) -> dict[str, Change]:
    """Each planned path's change as the commit takes it (what it was made against, the
    new content or None for a removal), read before the merge clears the staging area.
    (Content that is not the planned one is refused by the merge, which then settles the
    record empty.)"""
    stage = plan.staging
    return {
        change.path: Change(
            change.base_sha256,
            stage.base(change.path) if change.base_sha256 else None,
            stage.read(change.path) if change.op == "write" else None,
        )
        for change in plan.changes
    }


def overlap_report(exc: MergeOverlap) -> dict[str, Any]:
    """What the model and the person are told of a merge that stopped on an overlap."""
    return {
        "overlap": {
            "paths": exc.paths,
            "what": exc.what,
            "why": exc.why[:8000],
            "fix": (
                "Your change to "
                + ", ".join(exc.paths)
                + " was withdrawn and the person's version kept: read the file again and "
                "redo the change on top of it, then run the tests."
            ),
        },
        "reasons": [exc.what],
    }


class Flow:
    def __init__(
        self,
        workflow: Workflow,
        workspaces: Workspaces,
        merger: Merger,
        audit: AuditLog | None,
    ) -> None:
        self.workflow = workflow
        self.workspaces = workspaces
        self.merger = merger
        self.audit = audit
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, session_id: str) -> asyncio.Lock:
        """One staging change or merge decision of a session at a time."""
        return self._locks.setdefault(session_id, asyncio.Lock())

    async def _try(self, session_id: str, event: str, **kwargs: Any) -> Step:
        session = await self.workflow.get(session_id)
        try:
            outcome = await self.workflow.fire(session_id, event, **kwargs)
        except TransitionDenied as exc:
            return Step(event, session.state, None, f"{exc.what}: {exc.why}")
        return Step(event, outcome.from_state, outcome.session.state, notes=tuple(outcome.warnings))

    async def state(self, session_id: str) -> tuple[str, str, bool]:
        session = await self.workflow.get(session_id)
        exempted = session.data.exemption is not None
        return session.state, flow_of(session.mode, exempted), exempted

    # -- tools ----------------------------------------------------------------------
    async def plan_complete(self, session_id: str) -> list[Step]:
        return [await self._try(session_id, "plan_complete")]

    async def before_test_run(self, session_id: str) -> list[Step]:
        state, _, _ = await self.state(session_id)
        if state in ("code_writing", "exploring"):
            return [await self._try(session_id, "code_changed")]
        if state == "retroactive_testing":
            return [await self._try(session_id, "tests_written")]
        return []

    async def after_test_run(
        self, session_id: str, run: TestRun, *, whole: bool = True
    ) -> tuple[list[Step], Any]:
        """``whole``: the run was of the whole suite; a green run of part of it (paths or
        a keyword) proves nothing about the rest, so it does not lead to the merge."""
        state, _, _ = await self.state(session_id)
        steps: list[Step] = []
        review: Any = None
        if state == "test_writing":
            steps.append(await self._try(session_id, "tests_red"))
        elif state == "validating":
            green = run.is_green() or run.counts["found"] == 0
            if green and not whole:
                why = (
                    "part of the suite ran (paths or a keyword), which says nothing of the "
                    "rest: the merge needs a green run of the whole suite (test.run with no "
                    "paths and no keyword)"
                )
                return [Step("tests_passed", state, None, why)], None
            step = await self._try(session_id, "tests_passed" if green else "tests_failed")
            steps.append(step)
            if step.target == "reviewing":
                review = await self.review(session_id, tests_pass=run.is_green())
        return steps, review

    async def committed(self, session_id: str) -> list[Step]:
        await asyncio.to_thread(self.workspaces.landed(session_id).clear)
        return [await self._try(session_id, "commit_complete")]

    # -- reviewing ------------------------------------------------------------------
    async def review(self, session_id: str, *, tests_pass: bool) -> dict[str, Any]:
        """Plan the merge; auto-merge when the criteria hold, else wait for the user."""
        async with self.lock(session_id):
            stage = self.workspaces.get(session_id)
            plan = await asyncio.to_thread(self.merger.plan, stage, tests_pass=tests_pass)
            session = await self.workflow.get(session_id)
            reasons = list(plan.reasons) + list(session.data.review_required)
            if plan.auto and not session.data.review_required:
                try:
                    merged = await self._approve(session_id, plan, by="auto-merge")
                except TransitionDenied as exc:  # the tech-debt budget: nothing merged
                    reasons.append(f"{exc.what}: {exc.why}")
                except MergeOverlap as exc:  # nothing merged; the model redoes the file
                    return {"auto_merged": False, **overlap_report(exc)}
                else:
                    return {"auto_merged": True, "diff_lines": plan.diff_lines, **merged}
        return {
            "auto_merged": False,
            "waiting_for": "review.approve (with this plan_id) or review.reject, by the user",
            "plan_id": plan.plan_id,
            "reasons": reasons,
            "diff_lines": plan.diff_lines,
            "diff": plan.diff[:DIFF_PREVIEW],
        }

    async def approve(
        self, session_id: str, *, by: str, plan_id: str | None = None
    ) -> dict[str, Any]:
        """The user's approval of the plan they were shown (``plan_id``)."""
        async with self.lock(session_id):
            session = await self.workflow.get(session_id)
            if session.state != "reviewing":
                raise WorkflowError(
                    f"nothing to approve: the session is in {session.state}, not reviewing",
                    fix="Approve when the session waits in reviewing (/status shows it).",
                    why="only a change waiting for review can be approved",
                )
            stage = self.workspaces.get(session_id)
            plan = await asyncio.to_thread(self.merger.plan, stage, tests_pass=True)
            if plan_id is not None and plan_id != plan.plan_id:
                raise MergeConflict(
                    "the staged changes are not the ones you reviewed",
                    why=f"you approved plan {plan_id}; what is staged now is {plan.plan_id}",
                    fix="Look at the changes again (review.show) and approve those.",
                )
            return await self._approve(session_id, plan, by=by)

    async def _approve(self, session_id: str, plan: Any, *, by: str) -> dict[str, Any]:
        # a locked budget merges nothing; a smaller drop is merged with its notice
        budget = await self.workflow.check_budget(session_id, automatic=by == "auto-merge")
        meta = {"by": by, "files": ",".join(c.path for c in plan.changes)[:2000]}
        if budget:
            meta["budget"] = "; ".join(budget)[:1000]
        await self._audit(
            "merge_approved",
            session_id,
            f"merge approved by {by}: {len(plan.changes)} file(s), {plan.diff_lines} diff lines",
            meta,
            plan.diff,
        )
        await self.workflow.annotate(session_id, "merge_started", merge_started=by)
        landed = self.workspaces.landed(session_id)
        try:
            planned = await asyncio.to_thread(_changes, plan)
            # what the commit takes, recorded (pending) before the project changes: a
            # kernel killed mid-merge settles it when it completes the merge at start
            await asyncio.to_thread(landed.add, planned)
            result = await asyncio.to_thread(self.merger.merge, plan)
            if result.status == "failed":  # a file changed while it wrote: rolled back
                await asyncio.to_thread(landed.settle, list(result.merged))
                paths = [i.path for i in (*result.conflicts, *result.refused)]
                raise MergeOverlap(
                    f"nothing was merged: {', '.join(paths)} changed while the merge wrote "
                    "the session's changes, so every file was put back as it was",
                    paths=paths,
                    why=result.error or "",
                )
        except BaseException as exc:
            # nothing (or a resumable operation) was written: no approval stays behind,
            # and the record keeps a change only if an operation will still write it
            if landed.unsettled() and not await asyncio.to_thread(self.merger.log.pending):
                await asyncio.to_thread(landed.settle, [])
            await self.workflow.annotate(session_id, "merge_failed", merge_started=None)
            if isinstance(exc, MergeOverlap):
                await self._withdraw(session_id, exc)
            raise
        # a file merged three-way with the person's lines: the commit still takes only
        # the session's change (carried onto HEAD by git.commit), their lines stay theirs
        await asyncio.to_thread(landed.settle, list(getattr(result, "merged", [])))
        summary = await self._finish_merge(session_id, result)
        if budget:
            summary["budget"] = budget
        return summary

    async def _withdraw(self, session_id: str, exc: MergeOverlap) -> None:
        """The person changed files the session changed too, and the changes overlap:
        their version stays, the session's change to those files is withdrawn (shown in
        the error), and a strict session goes back to code_writing to redo it."""
        stage = self.workspaces.get(session_id)
        for path in exc.paths:
            await asyncio.to_thread(stage.drop, path)
        await self._audit(
            "merge_overlap", session_id, exc.what[:500], {"paths": ",".join(exc.paths)[:2000]},
            exc.why,
        )  # fmt: skip
        state, flow, _ = await self.state(session_id)
        if state == "reviewing" and flow == "strict":
            await self.workflow.annotate(session_id, "merge_overlap", review_required=None)
            await self._try(session_id, "merge_rejected")

    async def _finish_merge(self, session_id: str, result: Any) -> dict[str, Any]:
        conflicts = list(getattr(result, "conflicts", []))
        refused = list(getattr(result, "refused", []))
        merged = list(getattr(result, "merged", []))
        summary: dict[str, Any] = {
            "merged": merged,
            "conflicts": [str(c) for c in conflicts],
            "refused": [str(r) for r in refused],
            "operation": getattr(result, "operation_id", None),
        }
        if getattr(result, "three_way", None):  # the person's own lines are kept in them
            summary["three_way"] = list(result.three_way)
        if conflicts or refused:  # a git merge (a files merge lands whole or raises)
            await self.workflow.annotate(session_id, "merge_incomplete", merge_started=None)
            summary["state"] = "reviewing"
            summary["fix"] = (
                "The files listed changed in the project after they were staged. "
                "review.reject goes back to writing; redo those changes against the "
                "current content."
            )
            return summary
        self.workspaces.discard(session_id)
        await self.workflow.annotate(
            session_id, "merge_done", merge_started=None, review_required=None
        )
        step = await self._try(session_id, "merge_approved", approved=True)
        summary["workflow"] = [step.to_dict()]
        summary["state"] = step.target or step.source
        return summary

    async def add_tests(
        self, session_id: str, *, by: str, plan_id: str | None = None
    ) -> dict[str, Any]:
        """The user's third answer at a review: write tests for the change before the merge
        (reviewing -> retroactive_testing; the staged change stays as it is)."""
        async with self.lock(session_id):
            session = await self.workflow.get(session_id)
            if session.state != "reviewing":
                raise WorkflowError(
                    f"no review to add tests to: the session is in {session.state}, not reviewing",
                    fix="Ask for tests when a change waits for review (/status shows it).",
                    why="tests are added to a change that waits for review",
                )
            if flow_of(session.mode, session.data.exemption is not None) == "strict":
                raise WorkflowError(
                    "a strict-mode change has its tests already",
                    why="in strict mode the tests were written and failed before the code",
                    fix="Approve or reject the change; /add-tests is for explore-mode changes.",
                )
            exemption = session.data.exemption
            if exemption is not None:
                raise WorkflowError(
                    "tests cannot be added to an exempted change",
                    why=f"the session's {exemption.category} exemption covers its own "
                    "paths only, and tests are outside them",
                    fix="Approve or reject this change; add the tests in a TDD cycle after it.",
                )
            if plan_id is not None:
                stage = self.workspaces.get(session_id)
                plan = await asyncio.to_thread(self.merger.plan, stage, tests_pass=True)
                if plan_id != plan.plan_id:
                    raise MergeConflict(
                        "the staged changes are not the ones you reviewed",
                        why=f"you answered plan {plan_id}; what is staged now is {plan.plan_id}",
                        fix="Look at the changes again (review.show) and decide on those.",
                    )
            await self.workflow.annotate(session_id, "tests_decided", tests_requested=None)
            step = await self._try(session_id, "add_tests", by=by)
            if step.target is None:
                raise WorkflowError(
                    f"tests cannot be added now: {step.why}",
                    why="the workflow refused the step to retroactive_testing",
                    fix="Approve or reject the change instead; /status shows what the session "
                    "allows.",
                )
            return {"workflow": [step.to_dict()], "state": step.target, "kept": True}

    async def request_tests(self, session_id: str, reason: str) -> dict[str, Any]:
        """The AI's ``workflow.add_tests``: a request held for the user's review, which
        decides (the session stays in reviewing; nothing is merged or discarded here)."""
        async with self.lock(session_id):
            session = await self.workflow.get(session_id)
            exempted = session.data.exemption is not None
            if session.state != "reviewing" or session.mode == "strict" or exempted:
                raise WorkflowError(
                    "tests can be asked for only while an explore change waits for review",
                    why=f"the session is in {session.state} ({session.mode} mode"
                    + (", exempted)" if exempted else ")"),
                    fix="Write tests in the TDD flow instead.",
                )
            await self.workflow.annotate(session_id, "tests_requested", tests_requested=reason)
        return {
            "held_for_review": True,
            "note": "The user sees your request at the review and decides: tests first "
            "(retroactive_testing), merge as it is, or discard.",
        }

    async def reject(self, session_id: str) -> dict[str, Any]:
        async with self.lock(session_id):
            return await self._reject(session_id)

    async def _reject(self, session_id: str) -> dict[str, Any]:
        state, flow, _ = await self.state(session_id)
        if state != "reviewing":
            raise WorkflowError(
                f"nothing to reject: the session is in {state}, not reviewing",
                fix="Reject when the session waits in reviewing.",
                why="only a change waiting for review can be rejected",
            )
        stage = self.workspaces.get(session_id)
        diff = await asyncio.to_thread(stage.diff)
        await self._audit("merge_rejected", session_id, "merge rejected by the user", {}, diff)
        self.workspaces.discard(session_id)
        await self.workflow.annotate(
            session_id, "merge_discarded", review_required=None, merge_started=None
        )
        event = "merge_rejected" if flow == "strict" else "cancel"
        step = await self._try(session_id, event)
        return {"discarded": True, "workflow": [step.to_dict()], "state": step.target}

    async def resume(self) -> list[str]:
        """After a crash: complete the merge operation a kill interrupted, then move its
        session on.  Never starts a merge: an approval without an operation is dropped
        and the session waits in reviewing again."""
        completed = await asyncio.to_thread(self.merger.resume_pending)
        finished: list[str] = []
        session_id = await self.workflow.store.latest_session()
        for sid in [session_id] if session_id else []:
            session = await self.workflow.get(sid)
            if session.state != "reviewing" or not session.data.merge_started:
                continue
            landed = self.workspaces.landed(sid)
            written = [path for result in completed for path in result.merged]
            await asyncio.to_thread(landed.settle, written)  # what the merge really wrote
            if not completed:
                await self.workflow.annotate(sid, "merge_not_started", merge_started=None)
                continue
            for result in completed:
                await self._finish_merge(sid, result)
            finished.append(sid)
        return finished

    async def _audit(
        self, kind: str, session_id: str, summary: str, meta: dict[str, str], diff: str
    ) -> None:
        if self.audit is None:
            return
        session = await self.workflow.get(session_id)
        kept = diff[:DIFF_KEPT]
        seq = await self.audit.record(
            Event(
                kind,
                caller="kernel",
                session_id=session_id,
                session_mode=session.mode,
                state_machine_state=session.state,
                input_summary=summary,
                output_summary=diff[:DIFF_PREVIEW],
                metadata={**meta, "diff_sha256": hashlib.sha256(kept.encode()).hexdigest()},
            )
        )
        await self.workflow.store.keep_diff(seq, session_id, kept)
