"""``container.run``: a command the model asks for, run once in a fresh sandbox (ADR-062).

The kernel's side: the argv is checked here (before any policy rule or person sees it);
a command no rule allows is shown to the person, who answers once, for this command
for the rest of the session, or no; then the session's view and the project's test
environment are laid down exactly as for ``test.run`` (:mod:`.testprep`), and the
command runs in the container tool's code-executor sandbox: the project read-only, no
network, the template's limits, the call's time-out.  The answer carries its exit code
and bounded output (control characters visible) and the notes a test run would have
(a stale environment, an interpreter unlike the project's, a process limit hit); the
call's audit entries name the sandbox that ran it and the person's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fluffy.errors import EngineUnavailable, ToolInputInvalid
from fluffy.kernel.policy.argv import shown
from fluffy.kernel.tools.changes.workspace import Workspaces
from fluffy.kernel.tools.core.routedcall import Reviewer, RoutedCall
from fluffy.kernel.tools.routing.mcpreview import ask_user
from fluffy.kernel.tools.sandbox.pluginjob import PluginOutcome
from fluffy.kernel.tools.testing.testprep import TestPlan, TestPreparer
from fluffy.kernel.tools.testing.testrun import run_notes
from fluffy.kernel.workflow.machine import Workflow

TOOL = "container.run"
MAX_ARGS = 256
MAX_ARG_CHARS = 4096
MAX_COMMAND_CHARS = 64 * 1024


def command_argv(args: Mapping[str, Any]) -> tuple[str, ...]:
    """The argv a ``container.run`` call asks for, or :class:`ToolInputInvalid`."""
    argv = args.get("argv")
    example = 'e.g. {"argv": ["python", "-m", "mypkg"]}; a shell: ["sh", "-c", "..."]'
    if isinstance(argv, str):
        raise ToolInputInvalid(
            f"{TOOL}: argv must be a list of arguments, not a string",
            why="commands run without a shell, so a string has no agreed splitting",
            fix=f"Pass the command as a list, {example}.",
        )
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGS:
        raise ToolInputInvalid(
            f"{TOOL}: argv must be a list of 1 to {MAX_ARGS} strings",
            fix=f"Pass the command as a list, {example}.",
        )
    if not all(isinstance(arg, str) for arg in argv):
        raise ToolInputInvalid(f"{TOOL}: every argument in argv must be a string")
    if any(len(arg) > MAX_ARG_CHARS or "\x00" in arg for arg in argv) or not argv[0]:
        raise ToolInputInvalid(
            f"{TOOL}: an argument is empty (the program), holds a NUL or is longer than "
            f"{MAX_ARG_CHARS} characters",
            fix="Put long input in a file under /tmp first, or run a script.",
        )
    if sum(len(arg) for arg in argv) > MAX_COMMAND_CHARS:
        raise ToolInputInvalid(f"{TOOL}: the command is longer than {MAX_COMMAND_CHARS} chars")
    return tuple(argv)


def allow_rule(argv: tuple[str, ...]) -> str:
    """The policy rule that would let this exact command run without asking."""
    return f"a rule in .fluffy/policy.yaml: match: {{syscall: {TOOL}, command: [{shown(argv)!r}]}}"


async def run_command(
    call: RoutedCall,
    *,
    preparer: TestPreparer | None,
    workflow: Workflow,
    workspaces: Workspaces,
    sandbox: Callable[[RoutedCall, TestPlan], Awaitable[PluginOutcome]],
    release: Callable[[PluginOutcome], Awaitable[None]],
    reviewer: Reviewer | None,
    session_allowed: dict[str, set[str]],
) -> dict[str, Any]:
    argv = command_argv(call.args)
    line = shown(argv)
    if call.review is not None:  # no rule allows it: the person decides first
        await ask_user(
            call,
            reviewer=reviewer,
            session_allowed=session_allowed,
            key=f"{TOOL} {line}",
            allow_with=allow_rule(argv),
            shown_extra={"command": line},
        )
    if preparer is None:
        raise EngineUnavailable(
            f"{TOOL} needs a sandbox, and this kernel has no container engine",
            fix="Start Docker or Podman (`scripts/setup`), then restart the kernel.",
        )
    stage = workspaces.get(call.session.id)
    plan = await asyncio.to_thread(
        preparer.prepare,
        call.session.id,
        stage.overlay(),
        stage.tree,
        workflow.test_globs,
        coverage=False,
        tests=False,  # a command in the test environment, not the tests
    )
    outcome = await sandbox(call, plan)
    try:
        answer = dict(outcome.result)
    finally:
        await release(outcome)
    answer["command"] = line
    answer.update(run_notes(plan, preparer, str(answer.get("output", "")), call.spec.template))
    return answer
