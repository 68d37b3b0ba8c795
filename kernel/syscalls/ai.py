"""The AI session's syscalls on the CLI's socket (see docs/ipc.md).

``session.message`` starts a turn and returns at once; ``session.events`` long-polls its
events.  Only the user (the CLI's socket) starts tasks, pins context or lifts a
quarantine; the provider's settings (and its API key) arrive here and stay in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, get_args

import msgspec

from fluffy.errors import MergeOverlap
from fluffy.ipc.ai_types import ProviderConfig
from fluffy.ipc.results.events import SessionEvent
from fluffy.ipc.results.session import (
    Budget,
    CallDecided,
    CallDecision,
    CancelledSession,
    Instructions,
    MessageAccepted,
    PendingCall,
    Pins,
    SessionEvents,
    SessionList,
    SessionUsage,
)
from fluffy.ipc.results.workflow import Session
from fluffy.kernel.ai.loop import MAX_ROUNDS, SessionLoop
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.syscalls import CLI, Syscall, SyscallTable
from fluffy.kernel.merge.identity import clean
from fluffy.kernel.syscalls.workflow import SessionParams, _view
from fluffy.kernel.tools.changes.flow import overlap_report
from fluffy.kernel.workflow.budget import LOCK_KEY
from fluffy.kernel.workflow.sessiondata import DataChange

MAX_TEXT = 100_000
MAX_WAIT_MS = 30_000
CALL_DECISIONS: tuple[str, ...] = get_args(CallDecision)
#: A task or pinned text: not empty, not only whitespace (``pattern`` is searched).
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT, pattern=r"\S")]
#: The id of a request or held call the person was shown.
ShownId = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]


class CommitAuthor(msgspec.Struct, forbid_unknown_fields=True):
    """The person the AI's commits name (their git identity, read by the CLI)."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    email: Annotated[str, msgspec.Meta(min_length=1, max_length=254)]


class MessageParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    text: Text
    provider: ProviderConfig | None = None  # None: the scripted provider's defaults
    auto_approve: bool = False
    #: None: policy.yaml session.max_rounds (also the ceiling)
    max_rounds: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    #: the session's commits are authored by this person (None: the repository's
    #: [user], else fluffy's placeholder) and end with this trailer ("": none)
    author: CommitAuthor | None = None
    commit_trailer: Annotated[str, msgspec.Meta(max_length=500)] | None = None


class EventsParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    after: int = 0  # negative: where the stream stands now, no events
    wait_ms: int = 0


class ListParams(msgspec.Struct, forbid_unknown_fields=True):
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] | None = None  # None: 20


class PinParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    text: Annotated[str, msgspec.Meta(min_length=1, pattern=r"\S")]


class UnpinParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    index: int


class InstructionsParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str | None = None


class DecideExemptionParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    grant: bool
    request_id: ShownId
    reason: str | None = None


class DecideCallParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    review_id: ShownId
    decision: CallDecision
    reason: str | None = None


def ai_methods(
    loop: SessionLoop, *, max_rounds: Callable[[], int] = lambda: MAX_ROUNDS
) -> SyscallTable:
    workflow = loop.workflow
    memory = loop.memory

    async def message(context: CallContext, p: MessageParams) -> dict[str, Any]:
        text = p.text
        rounds = min(
            p.max_rounds or max_rounds(), max_rounds()
        )  # policy.yaml session.max_rounds is the ceiling
        identity: DataChange = {}
        if p.author is not None:
            identity["commit_author"] = clean(p.author.name, p.author.email)
        if p.commit_trailer is not None:
            identity["commit_trailer"] = " ".join(p.commit_trailer.split())
        if identity:
            await workflow.annotate(p.session_id, "commit_identity", **identity)
        turn = await loop.start(
            p.session_id,
            text,
            p.provider or ProviderConfig(),
            auto_approve=p.auto_approve,
            max_rounds=rounds,
        )
        session = await workflow.get(turn.session_id)
        return {"turn_id": turn.turn_id, **_view(session)}

    async def events(context: CallContext, p: EventsParams) -> dict[str, Any]:
        sid = p.session_id
        await workflow.get(sid)  # an unknown session fails before any wait
        after, wait_ms = p.after, p.wait_ms
        stream = loop.stream(sid)
        found: list[SessionEvent] = []  # the reply encodes the structs as they are
        if after < 0:  # where the stream stands now (a CLI joining mid-way)
            position = stream.seq
        else:
            found = await stream.wait(after, min(max(wait_ms, 0), MAX_WAIT_MS) / 1000)
            position = found[-1].seq if found else after
        session = await workflow.get(sid)
        return {
            "events": found,
            "next": position,
            "running": loop.running(sid) is not None,
            "mode": session.mode,
            "state": session.state,
            "quarantined": bool(session.data.quarantined),
        }

    async def cancel(context: CallContext, p: SessionParams) -> dict[str, Any]:
        sid = p.session_id
        stopped = await loop.cancel(sid)
        outcome = await workflow.cancel(sid)
        return {**_view(outcome.session), "turn_cancelled": stopped}

    async def session_list(context: CallContext, p: ListParams) -> dict[str, Any]:
        limit = p.limit or 20
        return {"sessions": await memory.sessions(workflow, limit)}

    async def usage(context: CallContext, p: SessionParams) -> dict[str, Any]:
        sid = p.session_id
        await workflow.get(sid)  # an unknown session is an error, not zero tokens
        return {"session_id": sid, **await memory.usage_report(sid)}

    async def pin(context: CallContext, p: PinParams) -> dict[str, Any]:
        await workflow.get(p.session_id)
        return {"pins": await memory.pin(p.session_id, p.text.strip())}

    async def pins(context: CallContext, p: SessionParams) -> dict[str, Any]:
        await workflow.get(p.session_id)
        return {"pins": await memory.pins(p.session_id)}

    async def unpin(context: CallContext, p: UnpinParams) -> dict[str, Any]:
        return {"pins": await memory.unpin(p.session_id, p.index)}

    async def lift(context: CallContext, p: SessionParams) -> dict[str, Any]:
        await loop.lift_quarantine(p.session_id)
        return _view(await workflow.get(p.session_id))

    async def budget(context: CallContext, p: SessionParams) -> dict[str, Any]:
        session = await workflow.get(p.session_id)
        report, notes = await workflow.baseline()  # the baseline file
        baseline = None if report is None else round(report.percent, 4)
        locked = await workflow.store.get_meta(LOCK_KEY) is not None
        latest = await workflow.latest_run(session)
        current = latest[2].percent if latest is not None and latest[2] is not None else None
        delta = None if baseline is None or current is None else round(current - baseline, 2)
        settings = workflow.tech_debt
        return {
            "baseline_file": settings.baseline_file,
            "notes": notes,
            "min_delta": settings.min_delta,
            "session_id": session.id,
            "mode": session.mode,
            "baseline": baseline,
            "current": current,
            "delta": delta,
            "locked": locked,
            "warn_at": workflow.tech_debt.warning_threshold,
            "lock_at": workflow.tech_debt.lockout_threshold,
        }

    async def instructions(context: CallContext, p: InstructionsParams) -> dict[str, Any]:
        sid = p.session_id or None
        if sid is not None:
            await workflow.get(sid)
        if loop.instructions is None:
            return {"files": [], "limit": 0, "truncated": False, "digest": ""}
        return (await loop.instructions(sid, "user")).view()

    async def decide_exemption(context: CallContext, p: DecideExemptionParams) -> dict[str, Any]:
        why = p.reason or ""
        sid = p.session_id
        outcome = await workflow.decide_exemption(
            sid, p.grant, request_id=p.request_id, by="user", why=why
        )
        result = _view(outcome.session)
        await loop.resolve_review(sid, "grant" if p.grant else "deny", result, why[:2000])
        return result

    async def decide_call(context: CallContext, p: DecideCallParams) -> dict[str, Any]:
        """The user's answer on a tool call held for review (an MCP tool, ADR-046)."""
        why = p.reason or ""
        sid = p.session_id
        await loop.decide_call(sid, p.review_id, p.decision, why[:2000])
        return {"session_id": sid, "review_id": p.review_id, "decision": p.decision}

    async def pending_call(context: CallContext, p: SessionParams) -> dict[str, Any]:
        sid = p.session_id
        await workflow.get(sid)
        return {"session_id": sid, "pending": loop.pending_call(sid)}

    return SyscallTable(
        [
            Syscall(
                "tool.decide",
                DecideCallParams,
                decide_call,
                CallDecided,
                since=1,
                callers=CLI,
                refusal="decide on a tool call",
            ),
            Syscall("tool.pending", SessionParams, pending_call, PendingCall, since=1),
            Syscall(
                "workflow.decide_exemption",
                DecideExemptionParams,
                decide_exemption,
                Session,
                since=1,
                callers=CLI,
                refusal="decide on a TDD exemption",
            ),
            Syscall(
                "session.message",
                MessageParams,
                message,
                MessageAccepted,
                since=1,
                callers=CLI,
                refusal="start a task",
            ),
            Syscall(
                "session.events",
                EventsParams,
                events,
                SessionEvents,
                since=1,
                callers=CLI,
                refusal="follow a session",
            ),
            Syscall("session.cancel", SessionParams, cancel, CancelledSession, since=1),
            Syscall("session.list", ListParams, session_list, SessionList, since=1),
            Syscall("session.usage", SessionParams, usage, SessionUsage, since=1),
            Syscall(
                "session.pin", PinParams, pin, Pins, since=1, callers=CLI, refusal="pin context"
            ),
            Syscall(
                "session.unpin",
                UnpinParams,
                unpin,
                Pins,
                since=1,
                callers=CLI,
                refusal="unpin context",
            ),
            Syscall("session.pins", SessionParams, pins, Pins, since=1),
            Syscall(
                "session.lift_quarantine",
                SessionParams,
                lift,
                Session,
                since=1,
                callers=CLI,
                refusal="lift a quarantine",
            ),
            Syscall("session.budget", SessionParams, budget, Budget, since=1),
            Syscall(
                "session.instructions",
                InstructionsParams,
                instructions,
                Instructions,
                since=1,
                callers=CLI,
                refusal="read the project's instructions",
            ),
        ]
    )


def with_review_hooks(methods: SyscallTable, loop: SessionLoop) -> SyscallTable:
    """review.approve / review.reject / review.add_tests also wake a turn that waits for
    the decision (each keeps its declaration: params, callers)."""
    approve = _handler(methods, "review.approve")
    reject = _handler(methods, "review.reject")
    add = _handler(methods, "review.add_tests")

    async def approved(context: CallContext, params: Any) -> Any:
        try:
            result = await approve(context, params)
        except MergeOverlap as exc:  # nothing merged; the turn tells the model, goes on
            await loop.resolve_review(params.session_id, "overlap", overlap_report(exc))
            raise
        await loop.resolve_review(params.session_id, "approve", result)
        return result

    async def rejected(context: CallContext, params: Any) -> Any:
        result = await reject(context, params)
        reason = params.reason or ""
        await loop.resolve_review(params.session_id, "reject", result, reason[:2000])
        return result

    async def add_tests(context: CallContext, params: Any) -> Any:
        result = await add(context, params)
        await loop.resolve_review(params.session_id, "add_tests", result)
        return result

    return (
        methods.replaced("review.approve", approved)
        .replaced("review.reject", rejected)
        .replaced("review.add_tests", add_tests)
    )


def _handler(methods: SyscallTable, name: str) -> Callable[[CallContext, Any], Any]:
    syscall = methods.syscall(name)
    assert syscall is not None, f"{name} is declared in kernel/syscalls/tools.py"
    return syscall.handler
