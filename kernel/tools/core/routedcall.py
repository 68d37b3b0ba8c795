"""One tool call on its way through the router, and the priorities calls run at.

:class:`RoutedCall` is what the router's steps -- authorise, execute, stage, record --
hand one another: the tool, the session as it was when the call was prepared, the
checked arguments and paths, and what each step learnt on the way (a review, the
capability token, the sandbox, the timings).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from fluffy.kernel.scheduler.task import PRIORITY_HIGH, PRIORITY_NORMAL
from fluffy.kernel.tools.core.capabilities import Scope
from fluffy.kernel.tools.core.registry import ToolSpec
from fluffy.kernel.workflow.store import SessionRow

#: The priority of a call (ADR-043): a model turn's calls, which the user watches,
#: before a client's direct tool.call / tool.batch, both before background work.
TURN_PRIORITY = PRIORITY_HIGH
CALL_PRIORITY = PRIORITY_NORMAL

#: Asks the user about one call that policy holds for review (session id, what is
#: shown) -> {"decision": "allow" | "allow_session" | "deny", "reason": ...}.
Reviewer = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class RoutedCall(msgspec.Struct):
    spec: ToolSpec
    session: SessionRow
    args: dict[str, Any]
    call_id: str
    reads: frozenset[str]
    writes: frozenset[str]
    review: str | None = None  # a policy rule asked for review of this write
    timings: dict[str, float] | None = None  # a plugin call's (see PluginOutcome)
    sandbox_id: str | None = None  # the sandbox a plugin call ran in (one per call)
    capability: Scope | None = None  # a write in a sandbox: what its token covers
    token_ops: str | None = None  # "used/max" uses of the call's token (None: no token)
    token: str | None = None  # how the audit log names the call's token
    priority: int = CALL_PRIORITY  # its sandbox's scheduler priority
    reviewed: str | None = None  # a call held for the user that they allowed (how)
    rule: str | None = None  # the policy rule(s) that allowed it (the audit entries' name)
    route: str | None = None  # where it ran, when not its spec's route (a fast tool's plugin)
