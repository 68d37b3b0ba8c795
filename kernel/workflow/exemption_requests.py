"""TDD exemptions asked for, held and decided (design: State Machine Module).

The user's own request is granted at once when the category's rule covers it; the AI's
is checked, audited and held, under an id, for the user's decision.  Every request,
grant and refusal is on the audit record.

:class:`ExemptionRequests` is :class:`~fluffy.kernel.workflow.machine.Workflow`'s
collaborator: each method runs with the workflow's lock held by its caller, and reads the
workflow's current audit log and exemption rules (a policy reload replaces them).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec
from msgspec.structs import replace

from fluffy.errors import ExemptionDenied, ExemptionMismatch, ExemptionPending
from fluffy.kernel.audit.entry import Event, now_ms
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.policy.tdd_settings import ExemptionRule
from fluffy.kernel.workflow.exemptions import check_exemption
from fluffy.kernel.workflow.sessiondata import Exemption, PendingExemption, SessionData
from fluffy.kernel.workflow.store import Outcome, SessionRow


class Host(Protocol):
    """What the requests need of the workflow that holds them."""

    audit: AuditLog | None
    exemptions: Mapping[str, ExemptionRule]

    async def get(self, session_id: str) -> SessionRow: ...

    async def record_step(
        self, session: SessionRow, event: str, from_state: str, note: dict[str, Any]
    ) -> None: ...

    async def entering(self, session: SessionRow, target: str, event: str) -> SessionData: ...


class ExemptionRequests:
    """The exemption requests of one workflow (callers hold its lock)."""

    def __init__(self, workflow: Host) -> None:
        self.workflow = workflow

    async def hold(
        self, session_id: str, category: str, paths: Sequence[str], reason: str
    ) -> SessionRow:
        """The AI's request: checked, audited and held for the user's decision
        (:meth:`decide`); never granted here.

        One request waits at a time (ExemptionPending while another does), and each held
        request has an id, recorded and shown to the user, that the decision must name.
        """
        session = await self.workflow.get(session_id)
        self._exemption_state(session)
        note = _exemption_note(category, paths, reason, by="ai")
        waiting = session.data.exemption_pending
        if waiting is not None:
            await self._refuse_second_request(session, note, waiting)
        request_id = _request_id()
        note["request_id"] = request_id
        await self._audit_exemption("exemption_requested", session, note, "held for review")
        await self._check_exemption(session, category, paths, reason, note)
        pending = PendingExemption(
            request_id=request_id, category=category, paths=list(paths), reason=reason
        )
        updated = replace(
            session,
            data=msgspec.structs.replace(session.data, exemption_pending=pending),
            updated_at=now_ms(),
        )
        await self.workflow.record_step(updated, "exemption_held", session.state, note)
        return updated

    async def _refuse_second_request(
        self, session: SessionRow, note: dict[str, str], waiting: PendingExemption
    ) -> None:
        """ExemptionPending, on the record: a second request must not replace the first."""
        held = waiting.request_id
        what = (
            f"another exemption request ({held}: {waiting.category} for "
            f"{', '.join(waiting.paths)}) waits for the user's decision"
        )
        refused = {**note, "refused_because": what[:400], "pending_request_id": held}
        await self._audit_exemption(
            "exemption_denied", session, refused, f"refused: {held} waits for the user"
        )
        raise ExemptionPending(what)

    async def decide(
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
        session = await self.workflow.get(session_id)
        pending = session.data.exemption_pending
        if pending is None:
            raise ExemptionDenied(
                "no exemption request waits for your decision",
                fix="/exempt asks for one yourself.",
            )
        category, paths, reason = pending.category, list(pending.paths), pending.reason
        held = pending.request_id
        if not held or request_id != held:
            raise ExemptionMismatch(
                f"the exemption request {request_id or '(no id)'} is not the one that "
                "waits for your decision",
                why=f"the request that waits is {held or '(no id)'}: {category} for "
                f"{', '.join(paths)[:400]} (reason: {reason[:400]})",
                fix=(
                    f"Decide on it by its id if that is what you mean ({held})."
                    if held
                    else "/cancel drops it; the AI may then ask again."
                ),
            )
        data = msgspec.structs.replace(session.data, exemption_pending=None)
        cleared = replace(session, data=data, updated_at=now_ms())
        note = _exemption_note(category, paths, reason, by=by)
        note["request_id"] = held
        if not grant:
            note["refused_because"] = why[:400]
            await self.workflow.record_step(cleared, "exemption_refused", session.state, note)
            await self._audit_exemption(
                "exemption_denied",
                session,
                note,
                f"refused by {by}" + (f": {why}" if why else ""),
            )
            return Outcome(cleared, session.state, "exemption_refused")
        await self.workflow.record_step(cleared, "exemption_decided", session.state, note)
        return await self.grant(
            session_id, category, paths, reason, by=by, requested_by="ai", request_id=held
        )

    @staticmethod
    def _exemption_state(session: SessionRow) -> None:
        if session.state not in ("planning", "test_writing"):
            raise ExemptionDenied(
                f"an exemption cannot start in {session.state}",
                why="exemptions replace the TDD flow before code is written",
                fix="Ask for it while planning (or /cancel first).",
            )

    async def _audit_exemption(
        self, kind: str, session: SessionRow, note: dict[str, str], outcome: str
    ) -> None:
        if self.workflow.audit is None:
            return
        await self.workflow.audit.record(
            Event(
                kind,
                caller=note.get("by", "user"),
                session_id=session.id,
                session_mode=session.mode,
                state_machine_state=session.state,
                input_summary=f"{note['category']}: {note['reason']}",
                output_summary=outcome,
                metadata=note,
            )
        )

    async def _check_exemption(
        self,
        session: SessionRow,
        category: str,
        paths: Sequence[str],
        reason: str,
        note: dict[str, str],
    ) -> ExemptionRule:
        """The category's rule, or ExemptionDenied -- a refusal on the record."""
        try:
            return check_exemption(self.workflow.exemptions, category, paths, reason)
        except ExemptionDenied as exc:
            refused = {**note, "refused_because": f"{exc.what}: {exc.why}"[:400]}
            await self._audit_exemption(
                "exemption_denied", session, refused, f"refused by policy: {exc.what}"
            )
            raise

    async def grant(
        self,
        session_id: str,
        category: str,
        paths: Sequence[str],
        reason: str,
        *,
        by: str = "user",
        requested_by: str | None = None,
        request_id: str = "",
    ) -> Outcome:
        """Grant the exemption (checked against the category's rule): the user's own
        request, or the AI's held one (``requested_by``) once the user agreed."""
        session = await self.workflow.get(session_id)
        self._exemption_state(session)
        note = _exemption_note(category, paths, reason, by=by)
        if requested_by is None:  # the AI's request was on record when it was held
            await self._audit_exemption("exemption_requested", session, note, f"asked by {by}")
        else:
            note["requested_by"] = requested_by
            note["request_id"] = request_id
        rule = await self._check_exemption(session, category, paths, reason, note)
        entered = await self.workflow.entering(session, "exploring", "exemption_granted")
        exemption = Exemption(
            category=category, paths=list(paths), reason=reason, condition=rule.condition or ""
        )
        data = msgspec.structs.replace(entered, exemption_pending=None, exemption=exemption)
        updated = replace(session, state="exploring", data=data, updated_at=now_ms())
        await self.workflow.record_step(updated, "exemption_granted", session.state, note)
        await self._audit_exemption("exemption_granted", updated, note, f"granted by {by}")
        return Outcome(updated, session.state, "exemption_granted")


def _exemption_note(category: str, paths: Sequence[str], reason: str, *, by: str) -> dict[str, str]:
    return {
        "category": category,
        "paths": ",".join(paths)[:400],
        "reason": reason[:400],
        "by": by,
    }


def _request_id() -> str:
    """A held request's id: fresh and never reused (the user decides on exactly it)."""
    return "ex-" + secrets.token_hex(8)
