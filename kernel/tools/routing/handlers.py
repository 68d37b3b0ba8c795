"""The kernel's own handlers of built-in tools, one per tool name, in one table.

A tool the kernel answers itself (the workflow's tools), or whose plugin call the kernel
wraps (``test.run``: its environment and evidence; ``container.run``: the person's yes;
``git.commit``: the session's landed record in, the commit applied out), has its handler
here; every other tool runs on its route (the fast path, an MCP server, its plugin's
sandbox) with nothing added.  The router looks a call's tool up in :data:`HANDLERS`
instead of comparing names along its way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from fluffy.kernel.tools.changes import staging
from fluffy.kernel.tools.core.routedcall import RoutedCall
from fluffy.kernel.tools.reading.fastpath import parse_args
from fluffy.kernel.tools.routing.commandrun import TOOL as COMMAND_TOOL
from fluffy.kernel.tools.routing.commandrun import run_command
from fluffy.kernel.tools.routing.moderequest import request_mode
from fluffy.kernel.tools.testing.testrun import run_tests

if TYPE_CHECKING:
    from fluffy.kernel.tools.routing.router import ToolRouter

Handler = Callable[["ToolRouter", RoutedCall], Awaitable[dict[str, Any]]]


async def plan_complete(router: ToolRouter, call: RoutedCall) -> dict[str, Any]:
    steps = await router.flow.plan_complete(call.session.id)
    router.expect(call.session, "fs.write")  # writes come next: have their sandbox ready
    return {"workflow": [s.to_dict() for s in steps]}


async def request_exemption(router: ToolRouter, call: RoutedCall) -> dict[str, Any]:
    args = parse_args(call.spec.name, call.args)
    held = await router.workflow.hold_exemption(
        call.session.id, args.category, list(args.paths), args.reason
    )
    return {
        "held_for_review": True,
        "exemption": msgspec.to_builtins(held.data.exemption_pending),
        "note": "The user decides on this exemption; the workflow waits for the "
        "answer. Nothing is exempt until the user grants it.",
    }


async def mode_request(router: ToolRouter, call: RoutedCall) -> dict[str, Any]:
    return await request_mode(call, workflow=router.workflow, reviewer=router.reviewer)


async def add_tests(router: ToolRouter, call: RoutedCall) -> dict[str, Any]:
    reason = parse_args(call.spec.name, call.args).reason
    return await router.flow.request_tests(call.session.id, reason)


async def test_run(router: ToolRouter, call: RoutedCall) -> dict[str, Any]:
    return await run_tests(
        call,
        preparer=router.runners.tests,
        flow=router.flow,
        workflow=router.workflow,
        workspaces=router.workspaces,
        sandbox=router.sandbox,
        release=router.release,
        expect=router.expect,
        require_all_green=router.checks.require_all_green,
    )


async def command(router: ToolRouter, call: RoutedCall) -> dict[str, Any]:
    return await run_command(
        call,
        preparer=router.runners.tests,
        workflow=router.workflow,
        workspaces=router.workspaces,
        sandbox=router.sandbox,
        release=router.release,
        reviewer=router.reviewer,
        session_allowed=router.session_allowed,
    )


async def git_commit(router: ToolRouter, call: RoutedCall) -> dict[str, Any]:
    """The session's merged changes (never the whole tree) in; the commit applied out."""
    order = await staging.commit_settings(call, router.workspaces, router.project)
    landed = router.workspaces.landed(call.session.id).root
    outcome = await router.sandbox(call, settings=order, staged_dir=landed)
    try:
        return await staging.commit(call, outcome, merger=router.flow.merger, flow=router.flow)
    finally:
        await router.release(outcome)


HANDLERS: dict[str, Handler] = {
    "plan.complete": plan_complete,
    "workflow.request_exemption": request_exemption,
    "workflow.request_mode": mode_request,
    "workflow.add_tests": add_tests,
    "test.run": test_run,
    COMMAND_TOOL: command,
    "git.commit": git_commit,
}
