"""The workflow's syscalls on the kernel's IPC (``session.*``, ``workflow.request_exemption``).

The caller's identity comes from the socket binding, never from the request: only the
CLI's socket speaks for the user (``approved`` is honoured from it alone); a plugin that
asks for a mode change is the plugin, and the policy engine judges it as such.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fluffy.errors import InvalidPayload, KernelOverloaded, PeerRejected
from fluffy.kernel.ipc.server import CallContext, Handler
from fluffy.kernel.policy.engine import Caller
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.store import SessionRow


def _params(
    params: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidPayload("params must be an object")
    unknown = set(params) - set(required) - set(optional)
    missing = [key for key in required if key not in params]
    if unknown or missing:
        missing_text = ", ".join(missing) or "nothing"
        unknown_text = ", ".join(sorted(unknown)) or "nothing"
        raise InvalidPayload(f"params: missing {missing_text}; unknown {unknown_text}")
    return params


def _view(session: SessionRow) -> dict[str, Any]:
    exemption = session.data.get("exemption")
    return {
        "session_id": session.id,
        "mode": session.mode,
        "state": session.state,
        "exemption": exemption,
        "exemption_pending": session.data.get("exemption_pending"),
        "unverified": bool(session.data.get("unverified")),
        "updated_at": session.updated_at,
    }


def _user_only(
    context: CallContext, what: str, fix: str = "Ask the user to do it in the fluffy CLI."
) -> None:
    """Refuse a call that did not come over the user's CLI socket."""
    if context.binding != "cli":
        raise PeerRejected(
            f"only the user may {what}",
            why=f"this connection is {context.binding}, not the CLI's socket",
            fix=fix,
        )


def _caller(context: CallContext) -> tuple[Caller, bool]:
    if context.binding == "cli":
        return Caller("user"), True
    return Caller(context.plugin_name or "plugin", container_id=context.container_id), False


def workflow_methods(
    workflow: Workflow, accepting_work: Callable[[], bool] = lambda: True
) -> dict[str, Handler]:
    async def create(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, (), ("mode", "approved"))
        if not accepting_work():
            raise KernelOverloaded("no new session now: the kernel is short of memory")
        caller, is_user = _caller(context)  # a plugin asking for a mode is judged as itself
        approved = bool(p.get("approved")) and is_user
        session = await workflow.new_session(p.get("mode", "strict"), caller, approved=approved)
        return _view(session)

    async def get(context: CallContext, params: Any) -> dict[str, Any] | None:
        p = _params(params, (), ("session_id",))
        session_id = p.get("session_id") or await workflow.store.latest_session()
        return _view(await workflow.get(session_id)) if session_id else None

    async def set_mode(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id", "mode"), ("approved",))
        caller, is_user = _caller(context)
        approved = bool(p.get("approved")) and is_user
        # the policy front notes its decision (and the request) for this call's audit entry
        outcome = await workflow.set_mode(p["session_id"], p["mode"], caller, approved=approved)
        return _view(outcome.session)

    async def exemption(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id", "category", "paths", "reason"))
        _user_only(  # granted at once: only the user's own request is
            context,
            "grant themselves a TDD exemption",
            fix="The AI asks with the workflow.request_exemption tool; the user decides.",
        )
        if not isinstance(p["paths"], list) or not all(isinstance(x, str) for x in p["paths"]):
            raise InvalidPayload("paths must be a list of strings")
        outcome = await workflow.request_exemption(
            p["session_id"], str(p["category"]), p["paths"], str(p["reason"])
        )
        return _view(outcome.session)

    async def cancel(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",))
        return _view((await workflow.cancel(p["session_id"])).session)

    async def history(context: CallContext, params: Any) -> list[dict[str, Any]]:
        p = _params(params, ("session_id",))
        await workflow.get(p["session_id"])  # verified against the chain first
        return await workflow.store.history(p["session_id"])

    return {
        "session.history": history,
        "session.create": create,
        "session.get": get,
        "session.set_mode": set_mode,
        "session.cancel": cancel,
        "workflow.request_exemption": exemption,
    }
