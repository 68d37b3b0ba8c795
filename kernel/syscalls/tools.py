"""The tool path's syscalls: ``tool.*`` and ``review.*``.

``tool.call`` / ``tool.batch`` are the AI's tool calls (relayed by the CLI's socket
here; the kernel's session loop calls the router directly).  Only the user (the CLI's
socket) approves or rejects a merge; ``session.message``, which starts a task, is the
AI layer's (``kernel/syscalls/ai.py``).
Plugin sandboxes never see these methods: each has its own socket with only
``tool.next`` / ``tool.result``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec

from fluffy.errors import InvalidPayload
from fluffy.ipc.results.tools import (
    Review,
    ReviewApproved,
    ReviewRejected,
    ReviewTestsFirst,
    ToolList,
    ToolOutcome,
    ToolStatus,
)
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.syscalls import CLI, NoParams, Syscall, SyscallTable
from fluffy.kernel.syscalls.workflow import OptionalSessionParams, SessionParams
from fluffy.kernel.tools.changes.flow import Flow
from fluffy.kernel.tools.routing.router import ToolRouter

MAX_BATCH = 32


class CallParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    tool: str
    args: dict[str, Any] | None = None  # None: {}
    call_id: str | None = None


class BatchParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    calls: list[dict[str, Any]]  # each {tool, args}; at most MAX_BATCH


class ApproveParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    plan_id: str  # the plan review.show answered: an approval is for what was shown


class AddTestsParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    plan_id: str | None = None


class RejectParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    plan_id: str | None = None
    reason: str | None = None


def tool_methods(
    router: ToolRouter, flow: Flow, scheduler: Callable[[], dict[str, Any]] | None = None
) -> SyscallTable:
    """The tool syscalls: calls through ``router``; reviews of ``flow``'s changes."""

    async def list_tools(context: CallContext, p: OptionalSessionParams) -> dict[str, Any]:
        available = await router.available(p.session_id) if p.session_id else None
        return {
            "tools": [spec.public() for spec in sorted(router.tools(), key=lambda s: s.name)],
            "available": available,
        }

    async def call(context: CallContext, p: CallParams) -> dict[str, Any]:
        return await router.call(p.session_id, p.tool, p.args or {}, call_id=p.call_id)

    async def batch(context: CallContext, p: BatchParams) -> list[dict[str, Any]]:
        if len(p.calls) > MAX_BATCH:
            raise InvalidPayload(f"at most {MAX_BATCH} calls in one batch")
        return await router.batch(p.session_id, p.calls)

    async def status(context: CallContext, p: NoParams) -> dict[str, Any]:
        return {**router.status(), "scheduler": scheduler() if scheduler is not None else None}

    async def review_show(context: CallContext, p: SessionParams) -> dict[str, Any]:
        session = await flow.workflow.get(p.session_id)  # a real session first
        stage = flow.workspaces.get(session.id)
        plan = await asyncio.to_thread(flow.merger.plan, stage, tests_pass=True)
        return {
            "state": session.state,
            "plan_id": plan.plan_id,
            "files": [c.path for c in plan.changes],
            "diff_lines": plan.diff_lines,
            "sensitive": list(plan.sensitive),
            "support": [str(change) for change in plan.support],
            "reasons": list(plan.reasons) + list(session.data.review_required),
            "diff": plan.diff,
        }

    async def approve(context: CallContext, p: ApproveParams) -> dict[str, Any]:
        return await flow.approve(p.session_id, by="user", plan_id=p.plan_id)

    async def add_tests(context: CallContext, p: AddTestsParams) -> dict[str, Any]:
        return await flow.add_tests(p.session_id, by="user", plan_id=p.plan_id)

    async def reject(context: CallContext, p: RejectParams) -> dict[str, Any]:
        session = await flow.workflow.get(p.session_id)
        return await flow.reject(session.id)

    return SyscallTable(
        [
            Syscall("tool.list", OptionalSessionParams, list_tools, ToolList, since=1),
            Syscall("tool.call", CallParams, call, ToolOutcome, since=1),
            Syscall("tool.batch", BatchParams, batch, list[ToolOutcome], since=1),
            Syscall("tool.status", NoParams, status, ToolStatus, since=1),
            Syscall("review.show", SessionParams, review_show, Review, since=1),
            Syscall(
                "review.approve",
                ApproveParams,
                approve,
                ReviewApproved,
                since=1,
                callers=CLI,
                refusal="approve a merge",
            ),
            Syscall(
                "review.reject",
                RejectParams,
                reject,
                ReviewRejected,
                since=1,
                callers=CLI,
                refusal="reject a merge",
            ),
            Syscall(
                "review.add_tests",
                AddTestsParams,
                add_tests,
                ReviewTestsFirst,
                since=1,
                callers=CLI,
                refusal="ask for tests before a merge",
            ),
        ]
    )
