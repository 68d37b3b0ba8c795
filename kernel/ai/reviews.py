"""The user's decisions inside a turn: merge reviews and TDD exemptions.

A test run that brings the session to ``reviewing`` either auto-merges or shows the
review and parks the turn (its provider sandbox closed) until the user approves,
rejects or asks for tests (``--yes`` approves at once unless a policy rule asks for a
person, or a file outside the source and test folders changes); an explore change may
first get one round in which the model asks for tests.
An exemption the AI asks for is only ever granted by the user.  Each decision reaches
the model as a kernel note.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from fluffy.errors import MergeOverlap
from fluffy.ipc.ai_types import Message, kernel_note
from fluffy.ipc.results.events import (
    ChangesMerged,
    ExemptionAsked,
    Notice,
    ReviewShown,
    StateChanged,
    ToolCallHeld,
)
from fluffy.kernel.ai.turn import Turn
from fluffy.kernel.tools.changes.flow import overlap_report

if TYPE_CHECKING:
    from fluffy.kernel.ai.host import TurnHost
    from fluffy.kernel.tools.changes.flow import Flow


class TurnReviews:
    """Asks the user and waits, for a turn of ``loop`` (kernel/ai/host.py); merges what
    they approve through ``router``'s flow."""

    def __init__(self, loop: TurnHost, flow: Flow, *, offers: Callable[[str], bool]) -> None:
        self.loop = loop
        self.flow = flow
        self.workflow = flow.workflow
        self.workspaces = flow.workspaces
        self.merger = flow.merger
        #: whether the session's tools include one (``workflow.add_tests``)
        self.offers = offers

    async def wait_for_user(self, turn: Turn) -> dict[str, Any]:
        """Park the turn until the user decides (``resolve_review``); no idle sandbox."""
        assert turn.review is not None
        if turn.provider_session is not None:  # the wait may be long
            self.loop.round_gaps.extend(turn.provider_session.gaps)
            await turn.provider_session.close()
            turn.provider_session = None
        decision = await turn.review
        turn.review = None
        turn.status = "running"
        return decision

    async def exemption(self, turn: Turn, output: dict[str, Any]) -> None:
        """The AI asked for a TDD exemption: only the user grants it (never --yes)."""
        sid = turn.session_id
        asked = dict(output.get("exemption") or {})
        held = await self.workflow.get(sid)
        before = held.state
        pending = held.data.exemption_pending
        if pending is None or pending.request_id != asked.get("request_id"):  # decided meanwhile
            note = (
                f"The exemption request {asked.get('request_id')} no longer waits (the user "
                f"decided on it). Workflow state: {held.state}."
            )
            await self.loop.memory.append(sid, [Message(role="user", content=kernel_note(note))])
            return
        turn.review = asyncio.get_running_loop().create_future()
        turn.status = "waiting_review"
        # the user decides on the request shown here, by its id (workflow.decide_exemption)
        shown = ExemptionAsked(
            kernel_decides=False,
            request_id=pending.request_id,
            category=pending.category,
            paths=list(pending.paths),
            reason=pending.reason,
        )
        await self.loop.emit(turn, shown)
        decision = await self.wait_for_user(turn)
        session = await self.workflow.get(sid)
        if session.state != before:  # granted: the explore flow starts
            await self.loop.emit(
                turn, StateChanged(from_=before, to=session.state, mode=session.mode)
            )
        if decision["decision"] == "grant":
            note = (
                f"The user granted the {asked.get('category')} exemption for "
                f"{', '.join(asked.get('paths') or [])}. Workflow state: {session.state}. "
                "Change only those files, then run test.run."
            )
        else:
            reason = str(decision.get("reason") or "").strip()
            said = f' They said: "{reason}".' if reason else ""
            note = (
                f"The user refused the exemption.{said} Workflow state: {session.state}. "
                "Follow the TDD flow: a failing test first."
            )
        await self.loop.memory.append(sid, [Message(role="user", content=kernel_note(note))])

    async def _overlap(self, turn: Turn, report: dict[str, Any]) -> None:
        """A merge stopped on the person's overlapping change: both are told, the model
        redoes the file (nothing was merged; its change to that file was withdrawn)."""
        found = report.get("overlap") or {}
        await self.loop.emit(
            turn,
            Notice(
                level="warn",
                what=str(found.get("what", "")),
                why="your version is kept; nothing of the change was merged",
                fix=str(found.get("fix", "")),
            ),
        )
        session = await self.workflow.get(turn.session_id)
        note = (
            f"{found.get('what', '')}. {found.get('fix', '')} Workflow state: {session.state}.\n"
            f"{str(found.get('why', ''))[:6000]}"
        )
        await self.loop.memory.append(
            turn.session_id, [Message(role="user", content=kernel_note(note))]
        )

    async def review(self, turn: Turn, review: dict[str, Any]) -> None:
        sid = turn.session_id
        if review.get("overlap"):
            await self._overlap(turn, review)
            return
        if review.get("auto_merged"):
            await self._budget_notices(turn, review)
            merged = list(review.get("merged") or [])
            reason = (
                f"tests pass, no sensitive files, {review.get('diff_lines', '?')} lines changed"
            )
            await self.loop.emit(
                turn, ChangesMerged(files=len(merged), paths=merged, auto=True, reason=reason)
            )
            return
        shown = await self._show(sid)
        session = await self.workflow.get(sid)
        # --yes stands for the user on size and sensitive files; a policy require_review
        # rule asks for a person, and so do changed test-support code (a green run may
        # rest on it: kernel/merge/support.py) and a file outside the source and test
        # folders (configuration a tool on the user's machine may run, ADR-054): those
        # reviews wait like any other
        auto = turn.auto_approve and not session.data.review_required and not shown.needs_person
        if not auto and shown.can_add_tests:
            requested = await self._review_round(turn)
            shown = msgspec.structs.replace(shown, tests_requested=requested)
        if not auto:  # ready before anyone is told: an approval can come at once
            turn.review = asyncio.get_running_loop().create_future()
            turn.status = "waiting_review"
        await self.loop.emit(turn, msgspec.structs.replace(shown, kernel_decides=auto))
        if auto:
            # shielded: a cancelled turn must not leave a merge half-recorded
            try:
                outcome = await asyncio.shield(
                    self.flow.approve(sid, by="user (--yes)", plan_id=shown.plan_id)
                )
            except MergeOverlap as exc:
                await self._overlap(turn, overlap_report(exc))
                return
            decision: dict[str, Any] = {"decision": "approve", "result": outcome}
        else:
            decision = await self.wait_for_user(turn)
        if decision["decision"] == "overlap":
            await self._overlap(turn, decision.get("result") or {})
            return
        result = decision.get("result") or {}
        if decision["decision"] == "approve":
            await self._budget_notices(turn, result)
            merged = list(result.get("merged") or [])
            await self.loop.emit(
                turn,
                ChangesMerged(
                    files=len(merged), paths=merged, auto=False, reason="approved by the user"
                ),
            )
            note = (
                "The user approved the merge; the changes are in the project. "
                f"Workflow state: {result.get('state', 'committing')}. Commit with git.commit."
            )
        elif decision["decision"] == "add_tests":
            session = await self.workflow.get(sid)
            await self.loop.emit(
                turn, StateChanged(from_="reviewing", to=session.state, mode=session.mode)
            )
            note = (
                "The user wants tests for this change before the merge; the staged change "
                f"stays as it is. Workflow state: {result.get('state', 'retroactive_testing')}. "
                "Write tests that cover the change (test files only), then run test.run: "
                "the change comes back for review with its tests."
            )
        else:
            reason = str(decision.get("reason") or "").strip()
            said = f' They said: "{reason}".' if reason else " Ask the user what to change."
            note = (
                "The user rejected the merge; the staged changes were discarded. "
                f"Workflow state: {result.get('state')}.{said}"
            )
        await self.loop.memory.append(sid, [Message(role="user", content=kernel_note(note))])

    async def _review_round(self, turn: Turn) -> str | None:
        """Before a person decides on an explore change, the model may ask for tests
        first (workflow.add_tests, one round); the person sees the request and decides."""
        sid = turn.session_id
        if not self.offers("workflow.add_tests"):
            return None
        ask = (
            "The change waits for the user's review. If it should get tests before it is "
            "merged, call workflow.add_tests with the reason (the user decides); otherwise "
            "say so in one sentence, without tools."
        )
        await self.loop.memory.append(sid, [Message(role="user", content=kernel_note(ask))])
        calls = await self.loop.ask(turn, only=frozenset({"workflow.add_tests"}))
        if calls:
            await self.loop.tool_calls.run(turn, calls)
        session = await self.workflow.get(sid)
        return session.data.tests_requested or None

    async def _budget_notices(self, turn: Turn, merge: dict[str, Any]) -> None:
        """A merge's tech-debt notices (coverage below min_delta or past the warning)."""
        for message in merge.get("budget") or []:
            await self.loop.emit(turn, Notice(level="warn", what=str(message), why="", fix=""))

    async def _show(self, session_id: str) -> ReviewShown:
        """The review as the person is shown it (the kernel's decision on it comes later)."""
        stage = self.workspaces.get(session_id)
        plan = await asyncio.to_thread(self.merger.plan, stage, tests_pass=True)
        session = await self.workflow.get(session_id)
        exempted = session.data.exemption is not None
        return ReviewShown(
            auto=False,
            kernel_decides=False,
            plan_id=plan.plan_id,
            files=[c.path for c in plan.changes],
            lines=plan.diff_lines,
            diff=plan.diff[:20_000],
            reasons=list(plan.reasons) + list(session.data.review_required),
            support=[str(change) for change in plan.support],
            # test-support code or files outside the allow-list: --yes does not stand in
            # for a person here
            needs_person=bool(plan.outside or plan.support),
            # explore changes may get tests first (review.add_tests, /add-tests)
            can_add_tests=session.mode != "strict" and not exempted,
        )


def held_call(shown: dict[str, Any]) -> ToolCallHeld:
    """The ``tool_review`` event of a call the tool router holds for the person (what
    they are shown: kernel/tools/routing/mcpreview.py's ``ask_user``)."""
    return ToolCallHeld(
        kernel_decides=False,
        review_id=shown["review_id"],
        tool=shown["tool"],
        arguments=shown["arguments"],
        reason=shown["reason"],
        description=shown["description"],
        allow_with=shown["allow_with"],
        # container.run's command line only
        command=shown.get("command", msgspec.UNSET),
    )
