"""The tool path's syscalls: ``tool.*``, ``review.*`` and ``session.message``.

``tool.call`` / ``tool.batch`` are the AI's tool calls (relayed by the CLI's socket
here; in [8/9] the kernel's session loop calls the router directly).  Only the user
(the CLI's socket) approves or rejects a merge, or sends the message that starts a task.
Plugin sandboxes never see these methods: each has its own socket with only
``tool.next`` / ``tool.result``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fluffy.errors import InvalidPayload
from fluffy.kernel.ipc.server import CallContext, Handler
from fluffy.kernel.tools.router import ToolRouter
from fluffy.kernel.workflow.methods import _params, _user_only, _view

MAX_BATCH = 32


def tool_methods(
    router: ToolRouter, scheduler: Callable[[], dict[str, Any]] | None = None
) -> dict[str, Handler]:
    flow = router.flow

    async def list_tools(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, (), ("session_id",))
        available = await router.available(p["session_id"]) if p.get("session_id") else None
        return {
            "tools": [spec.public() for spec in sorted(router.tools(), key=lambda s: s.name)],
            "available": available,
        }

    async def call(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id", "tool"), ("args", "call_id"))
        return await router.call(
            str(p["session_id"]), str(p["tool"]), p.get("args") or {}, call_id=p.get("call_id")
        )

    async def batch(context: CallContext, params: Any) -> list[dict[str, Any]]:
        p = _params(params, ("session_id", "calls"))
        calls = p["calls"]
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise InvalidPayload("calls must be a list of {tool, args} objects")
        if len(calls) > MAX_BATCH:
            raise InvalidPayload(f"at most {MAX_BATCH} calls in one batch")
        return await router.batch(str(p["session_id"]), calls)

    async def status(context: CallContext, params: Any) -> dict[str, Any]:
        return {
            "breakers": {k: v.to_dict() for k, v in router.breakers.snapshot().items()},
            "fast_path": router.settings.fast_path,
            "scheduler": scheduler() if scheduler is not None else None,
        }

    async def message(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id", "text"))
        _user_only(context, "start a task")
        session = await router.workflow.get(str(p["session_id"]))
        if session.state == "idle":
            session = (await router.workflow.fire(session.id, "user_message")).session
        return _view(session)

    async def review_show(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",))
        session = await router.workflow.get(str(p["session_id"]))  # a real session first
        stage = router.workspaces.get(session.id)
        plan = await asyncio.to_thread(router.merger.plan, stage, tests_pass=True)
        return {
            "state": session.state,
            "plan_id": plan.plan_id,
            "files": [c.path for c in plan.changes],
            "diff_lines": plan.diff_lines,
            "sensitive": list(plan.sensitive),
            "reasons": list(plan.reasons) + list(session.data.get("review_required", [])),
            "diff": plan.diff,
        }

    async def approve(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id", "plan_id"))  # what the user was shown
        _user_only(context, "approve a merge")
        return await flow.approve(str(p["session_id"]), by="user", plan_id=str(p["plan_id"]))

    async def add_tests(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",), ("plan_id",))
        _user_only(context, "ask for tests before a merge")
        plan_id = p.get("plan_id")
        return await flow.add_tests(
            str(p["session_id"]), by="user", plan_id=None if plan_id is None else str(plan_id)
        )

    async def reject(context: CallContext, params: Any) -> dict[str, Any]:
        p = _params(params, ("session_id",), ("plan_id", "reason"))
        _user_only(context, "reject a merge")
        session = await router.workflow.get(str(p["session_id"]))
        return await flow.reject(session.id)

    return {
        "tool.list": list_tools,
        "tool.call": call,
        "tool.batch": batch,
        "tool.status": status,
        "session.message": message,
        "review.show": review_show,
        "review.approve": approve,
        "review.reject": reject,
        "review.add_tests": add_tests,
    }
