"""The workflow's syscalls on the kernel's IPC (``session.*``, ``workflow.request_exemption``).

The caller's identity comes from the socket binding, never from the request: only the
CLI's socket speaks for the user (``approved`` is honoured from it alone); a plugin that
asks for a mode change is the plugin, and the policy engine judges it as such.
``session.cancel`` is the AI layer's (``kernel/syscalls/ai.py``): it stops a running turn,
then cancels the workflow's session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from fluffy.errors import KernelOverloaded
from fluffy.ipc.results.workflow import Session, Transition
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.syscalls import CLI, Syscall, SyscallTable
from fluffy.kernel.policy.engine import Caller
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.states import PERSON, Mode
from fluffy.kernel.workflow.store import SessionRow


class CreateParams(msgspec.Struct, forbid_unknown_fields=True):
    mode: Mode = "strict"
    approved: bool = False  # honoured from the CLI's socket only


class OptionalSessionParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str | None = None  # None: the latest session


class SessionParams(msgspec.Struct, forbid_unknown_fields=True):
    """The params of a syscall about one session."""

    session_id: str


class SetModeParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    mode: Mode
    approved: bool = False  # honoured from the CLI's socket only


class ExemptionParams(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str
    category: str
    paths: list[str]
    reason: str


def _view(session: SessionRow) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "mode": session.mode,
        "state": session.state,
        "exemption": session.data.exemption,
        "exemption_pending": session.data.exemption_pending,
        "unverified": session.data.unverified,
        "updated_at": session.updated_at,
    }


def _caller(context: CallContext) -> tuple[Caller, bool]:
    if context.binding == "cli":  # the person (their CLI's socket): tagged so
        return Caller("user", tags=PERSON), True  # a rule can name them
    return Caller(context.plugin_name or "plugin", container_id=context.container_id), False


def workflow_methods(
    workflow: Workflow, accepting_work: Callable[[], bool] = lambda: True
) -> SyscallTable:
    async def create(context: CallContext, p: CreateParams) -> dict[str, Any]:
        if not accepting_work():
            raise KernelOverloaded("no new session now: the kernel is short of memory")
        caller, is_user = _caller(context)  # a plugin asking for a mode is judged as itself
        approved = p.approved and is_user
        # a mode not in MODES is refused by set_mode (ModeDenied names the modes)
        session = await workflow.new_session(p.mode, caller, approved=approved)
        return _view(session)

    async def get(context: CallContext, p: OptionalSessionParams) -> dict[str, Any] | None:
        session_id = p.session_id or await workflow.store.latest_session()
        return _view(await workflow.get(session_id)) if session_id else None

    async def set_mode(context: CallContext, p: SetModeParams) -> dict[str, Any]:
        caller, is_user = _caller(context)
        approved = p.approved and is_user
        # the policy front notes its decision (and the request) for this call's audit entry
        outcome = await workflow.set_mode(p.session_id, p.mode, caller, approved=approved)
        return _view(outcome.session)

    async def exemption(context: CallContext, p: ExemptionParams) -> dict[str, Any]:
        outcome = await workflow.request_exemption(p.session_id, p.category, p.paths, p.reason)
        return _view(outcome.session)

    async def history(context: CallContext, p: SessionParams) -> list[dict[str, Any]]:
        await workflow.get(p.session_id)  # verified against the chain first
        return await workflow.store.history(p.session_id)

    return SyscallTable(
        [
            Syscall("session.history", SessionParams, history, list[Transition], since=1),
            Syscall("session.create", CreateParams, create, Session, since=1),
            Syscall("session.get", OptionalSessionParams, get, Session | None, since=1),
            Syscall("session.set_mode", SetModeParams, set_mode, Session, since=1),
            Syscall(
                "workflow.request_exemption",
                ExemptionParams,
                exemption,
                Session,
                since=1,
                # granted at once: only the user's own request is
                callers=CLI,
                refusal="grant themselves a TDD exemption",
                fix="The AI asks with the workflow.request_exemption tool; the user decides.",
            ),
        ]
    )
