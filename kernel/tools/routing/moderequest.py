"""``workflow.request_mode``: the model asks the person to switch the session's mode.

The model cannot switch modes (only the person's caller tag may, by the policy); it may
ask, while planning, with a reason.  The person sees the question like any call held for
review and answers it at once; a yes switches the mode as the person's own choice (debug
included: this answer is the yes debug mode asks for), a no is the model's refusal.
"""

from __future__ import annotations

from typing import Any

from fluffy.errors import ModeDenied
from fluffy.kernel.policy.engine import Caller
from fluffy.kernel.tools.core.routedcall import Reviewer, RoutedCall
from fluffy.kernel.tools.reading.fastpath import parse_args
from fluffy.kernel.tools.routing.mcpreview import ask_user
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.states import PERSON


async def request_mode(
    call: RoutedCall, *, workflow: Workflow, reviewer: Reviewer | None
) -> dict[str, Any]:
    args = parse_args(call.spec.name, call.args)
    session = await workflow.get(call.session.id)
    current = session.mode
    if session.state not in ("idle", "planning"):  # never ask what set_mode would refuse
        raise ModeDenied(
            f"the mode cannot change in {session.state}",
            why="a flow in progress would lose its guarantees",
            fix="Finish or cancel this change first; ask for another mode while planning.",
        )
    if args.mode == current:
        return {"mode": current, "note": f"The session is already in {current} mode."}
    call.review = f"the model asks to switch this session from {current} to {args.mode} mode"
    await ask_user(
        call,
        reviewer=reviewer,
        session_allowed={},  # each request is asked on its own
        key=f"mode:{args.mode}",
        allow_with="your answer only: the model cannot switch modes itself",
    )
    outcome = await workflow.set_mode(
        call.session.id, args.mode, Caller("user", tags=PERSON), approved=True
    )
    return {
        "mode": outcome.session.mode,
        "note": f"The user switched the session to {outcome.session.mode} mode; the tools "
        "of that mode are available from the next call.",
    }
