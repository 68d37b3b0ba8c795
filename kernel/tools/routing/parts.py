"""What the tool router is built from, in two cohesive parts besides the session's
change (:class:`~fluffy.kernel.tools.changes.flow.Flow`): what every call is held to
(:class:`CallChecks`) and where a call that leaves the kernel runs (:class:`CallRunners`).

The kernel's assembly (``kernel/syscalls/assemble_tools.py``) builds each part once; tests
build the parts they need and keep the defaults for the rest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from fluffy.kernel.policy.audited import AuditedPolicy
from fluffy.kernel.policy.tool_settings import ToolSettings
from fluffy.kernel.scheduler.scheduler import Scheduler
from fluffy.kernel.tools.reading.sanitizer import OutputSanitizer
from fluffy.kernel.tools.routing.breaker import BreakerBoard
from fluffy.kernel.tools.routing.mcpreview import McpCalls
from fluffy.kernel.tools.sandbox.plugins import PluginRunner
from fluffy.kernel.tools.testing.testprep import TestPreparer

#: Runs a plugin call under the scheduler: (template, call id, coroutine factory,
#: priority).
Schedule = Callable[[str, str, Callable[[], Awaitable[Any]], int], Awaitable[Any]]


async def direct(template: str, key: str, work: Callable[[], Awaitable[Any]], priority: int) -> Any:
    """No scheduler: the work runs at once."""
    return await work()


def always() -> bool:
    return True


class CallChecks(msgspec.Struct, frozen=True):
    """What every call is held to: the policy's say, the tools' settings (timeouts, the
    fast path), the output sanitiser, the plugins' circuit breakers, the paths no write
    may touch, and whether a failure on the base tree too blocks a merge
    (``tdd.require_all_green``)."""

    policy: AuditedPolicy
    settings: ToolSettings
    sanitizer: OutputSanitizer
    breakers: BreakerBoard
    protected: tuple[str, ...] = ()
    require_all_green: bool = False


class CallRunners(msgspec.Struct, frozen=True):
    """Where a call that leaves the kernel runs: its plugin's sandbox (None: no container
    engine) under the scheduler's limits, test runs in their environment and view, the
    project's MCP servers (ADR-046).  ``steps`` orders a batch's dependent calls (None: a
    private scheduler per batch, ADR-043); ``accepting_work`` is False while the kernel is
    short of memory."""

    plugins: PluginRunner | None = None
    schedule: Schedule = direct
    steps: Scheduler | None = None
    accepting_work: Callable[[], bool] = always
    tests: TestPreparer | None = None
    mcp: McpCalls | None = None
