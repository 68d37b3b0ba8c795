"""The AI session's syscalls on the CLI's socket (see docs/ipc.md).

``session.message`` starts a turn and returns at once; ``session.events`` long-polls its
events.  Only the user (the CLI's socket) starts tasks, pins context or lifts a
quarantine; the provider's settings (and its API key) arrive here and stay in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from fluffy.errors import InvalidPayload
from fluffy.ipc.ai_types import ProviderConfig
from fluffy.kernel.ai.loop import MAX_ROUNDS, SessionLoop
from fluffy.kernel.ipc.server import CallContext, Handler
from fluffy.kernel.workflow.machine import LOCK_KEY
from fluffy.kernel.workflow.methods import _params, _user_only, _view

MAX_TEXT = 100_000
MAX_WAIT_MS = 30_000
CALL_DECISIONS = ("allow", "allow_session", "deny")


def _provider(raw: Any) -> ProviderConfig:
    try:
        return msgspec.convert(raw or {}, ProviderConfig)
    except msgspec.ValidationError as exc:
        raise InvalidPayload(
            f"provider: {exc}",
            fix="name is scripted, openai or anthropic; model/base_url/api_key are strings.",
        ) from None


def ai_methods(
    loop: SessionLoop, *, max_rounds: Callable[[], int] = lambda: MAX_ROUNDS
) -> dict[str, Handler]:
    workflow = loop.router.workflow
    memory = loop.memory

    async def message(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id", "text"), ("provider", "auto_approve", "max_rounds"))
        _user_only(context, "start a task")
        text = p["text"]
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_TEXT:
            raise InvalidPayload(f"text must be a non-empty string of at most {MAX_TEXT} chars")
        rounds = p.get("max_rounds") or max_rounds()
        if not isinstance(rounds, int) or not 1 <= rounds <= 1000:
            raise InvalidPayload("max_rounds must be an integer from 1 to 1000")
        rounds = min(rounds, max_rounds())  # policy.yaml session.max_rounds is the ceiling
        turn = await loop.start(
            str(p["session_id"]),
            text,
            _provider(p.get("provider")),
            auto_approve=bool(p.get("auto_approve")),
            max_rounds=rounds,
        )
        session = await workflow.get(turn.session_id)
        return {"turn_id": turn.turn_id, **_view(session)}

    async def events(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",), ("after", "wait_ms"))
        _user_only(context, "follow a session")
        sid = str(p["session_id"])
        await workflow.get(sid)  # an unknown session fails before any wait
        after, wait_ms = p.get("after") or 0, p.get("wait_ms") or 0
        if not isinstance(after, int) or not isinstance(wait_ms, int):
            raise InvalidPayload("after and wait_ms must be integers")
        stream = loop.stream(sid)
        found: list[dict[str, Any]] = []
        if after < 0:  # where the stream stands now (a CLI joining mid-way)
            position = stream.seq
        else:
            found = await stream.wait(after, min(max(wait_ms, 0), MAX_WAIT_MS) / 1000)
            position = found[-1]["seq"] if found else after
        session = await workflow.get(sid)
        return {
            "events": found,
            "next": position,
            "running": loop.running(sid) is not None,
            "mode": session.mode,
            "state": session.state,
            "quarantined": bool(session.data.get("quarantined")),
        }

    async def cancel(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",))
        sid = str(p["session_id"])
        stopped = await loop.cancel(sid)
        outcome = await workflow.cancel(sid)
        return {**_view(outcome.session), "turn_cancelled": stopped}

    async def session_list(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, (), ("limit",))
        limit = p.get("limit") or 20
        if not isinstance(limit, int) or not 1 <= limit <= 500:
            raise InvalidPayload("limit must be an integer from 1 to 500")
        return {"sessions": await memory.sessions(workflow, limit)}

    async def usage(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",))
        sid = str(p["session_id"])
        await workflow.get(sid)  # an unknown session is an error, not zero tokens
        return {"session_id": sid, **await memory.usage_report(sid)}

    async def pin(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id", "text"))
        _user_only(context, "pin context")
        await workflow.get(str(p["session_id"]))
        if not isinstance(p["text"], str) or not p["text"].strip():
            raise InvalidPayload("text must be a non-empty string")
        return {"pins": await memory.pin(str(p["session_id"]), p["text"].strip())}

    async def pins(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",))
        await workflow.get(str(p["session_id"]))
        return {"pins": await memory.pins(str(p["session_id"]))}

    async def unpin(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id", "index"))
        _user_only(context, "unpin context")
        if not isinstance(p["index"], int):
            raise InvalidPayload("index must be an integer")
        return {"pins": await memory.unpin(str(p["session_id"]), p["index"])}

    async def lift(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",))
        _user_only(context, "lift a quarantine")
        await loop.lift_quarantine(str(p["session_id"]))
        return _view(await workflow.get(str(p["session_id"])))

    async def budget(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",))
        session = await workflow.get(str(p["session_id"]))
        report, notes = await workflow.baseline()  # the baseline file
        baseline = None if report is None else round(report.percent, 4)
        locked = await workflow.store.get_meta(LOCK_KEY) is not None
        latest = await workflow._latest(session)
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

    async def instructions(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, (), ("session_id",))
        _user_only(context, "read the project's instructions")
        sid = str(p["session_id"]) if p.get("session_id") else None
        if sid is not None:
            await workflow.get(sid)
        if loop.instructions is None:
            return {"files": [], "limit": 0, "truncated": False, "digest": ""}
        return (await loop.instructions(sid, "user")).view()

    async def decide_exemption(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id", "grant", "request_id"), ("reason",))
        _user_only(context, "decide on a TDD exemption")
        if not isinstance(p["grant"], bool):
            raise InvalidPayload("grant must be true or false")
        if not isinstance(p["request_id"], str) or len(p["request_id"]) > 100:
            raise InvalidPayload("request_id must be the id of the request shown (a string)")
        why = str(p["reason"]) if isinstance(p.get("reason"), str) else ""
        sid = str(p["session_id"])
        outcome = await workflow.decide_exemption(
            sid, p["grant"], request_id=p["request_id"], by="user", why=why
        )
        result = _view(outcome.session)
        await loop.resolve_review(sid, "grant" if p["grant"] else "deny", result, why[:2000])
        return result

    async def decide_call(context: CallContext, params: Any) -> dict[str, Any]:
        """The user's answer on a tool call held for review (an MCP tool, ADR-046)."""
        p = _params(params, ("session_id", "review_id", "decision"), ("reason",))
        _user_only(context, "decide on a tool call")
        if p["decision"] not in CALL_DECISIONS:
            raise InvalidPayload("decision must be one of " + ", ".join(CALL_DECISIONS))
        if not isinstance(p["review_id"], str) or len(p["review_id"]) > 100:
            raise InvalidPayload("review_id must be the id of the call shown (a string)")
        why = str(p["reason"]) if isinstance(p.get("reason"), str) else ""
        sid = str(p["session_id"])
        await loop.decide_call(sid, p["review_id"], p["decision"], why[:2000])
        return {"session_id": sid, "review_id": p["review_id"], "decision": p["decision"]}

    async def pending_call(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",))
        sid = str(p["session_id"])
        await workflow.get(sid)
        return {"session_id": sid, "pending": loop.pending_call(sid)}

    return {
        "tool.decide": decide_call,
        "tool.pending": pending_call,
        "workflow.decide_exemption": decide_exemption,
        "session.message": message,
        "session.events": events,
        "session.cancel": cancel,
        "session.list": session_list,
        "session.usage": usage,
        "session.pin": pin,
        "session.unpin": unpin,
        "session.pins": pins,
        "session.lift_quarantine": lift,
        "session.budget": budget,
        "session.instructions": instructions,
    }


def with_review_hooks(methods: dict[str, Handler], loop: SessionLoop) -> dict[str, Handler]:
    """review.approve / review.reject / review.add_tests also wake a turn that waits for
    the decision."""
    out = dict(methods)
    approve, reject = methods["review.approve"], methods["review.reject"]

    async def approved(context: CallContext, params: Any) -> Any:
        result = await approve(context, params)
        await loop.resolve_review(str(params["session_id"]), "approve", result)
        return result

    async def rejected(context: CallContext, params: Any) -> Any:
        result = await reject(context, params)
        reason = params.get("reason") if isinstance(params.get("reason"), str) else ""
        await loop.resolve_review(str(params["session_id"]), "reject", result, reason[:2000])
        return result

    async def add_tests(context: CallContext, params: Any) -> Any:
        result = await methods["review.add_tests"](context, params)
        await loop.resolve_review(str(params["session_id"]), "add_tests", result)
        return result

    out["review.approve"] = approved
    out["review.reject"] = rejected
    out["review.add_tests"] = add_tests
    return out
