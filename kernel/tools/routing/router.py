"""The tool router: policy check → route → execute → sanitise → audit → return.

Every AI tool call takes this path (design: AI Tools Module).  The answer is always a
result object — a refusal or a failure is a result the AI reads, never a broken
connection: ``{"ok": false, "error": {...}}`` with the error's code, what / why / fix,
``retryable``, and for a tool the workflow does not allow now the design's
ToolUnavailableError fields.

Routing: read-only tools run kernel-native (the fast path); writes, test runs and git
run in a fresh L2 sandbox of their plugin (:mod:`fluffy.kernel.tools.sandbox.plugins`), whose
output is validated and *staged*; only the merge in ``reviewing`` writes the project.
Reads are retried once after 100 ms; writes never (their errors say whether a retry
makes sense).  Each call leaves a ``tool_execute`` and a ``tool_result`` audit entry
(the latter with the sanitised output and the original's size and hash).

The steps live beside it: :mod:`~fluffy.kernel.tools.routing.authorise` (the policy's say),
:mod:`~fluffy.kernel.tools.changes.staging` (a sandbox's changes checked and staged),
:mod:`~fluffy.kernel.tools.testing.testrun`, :mod:`~fluffy.kernel.tools.routing.mcpreview` and
:mod:`~fluffy.kernel.tools.routing.callaudit` (the answer and its audit entries).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fluffy.errors import (
    EngineUnavailable,
    FluffyError,
    KernelOverloaded,
    ToolFailed,
    ToolNotFound,
)
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.policy.audited import AuditedPolicy
from fluffy.kernel.policy.tool_settings import ToolSettings
from fluffy.kernel.scheduler.scheduler import Scheduler
from fluffy.kernel.tools.changes import staging
from fluffy.kernel.tools.changes.flow import Flow
from fluffy.kernel.tools.changes.workspace import Workspaces
from fluffy.kernel.tools.core.registry import Registry, ToolSpec
from fluffy.kernel.tools.core.routedcall import CALL_PRIORITY, Reviewer, RoutedCall
from fluffy.kernel.tools.reading.fastpath import FastPath, parse_args
from fluffy.kernel.tools.reading.sanitizer import OutputSanitizer
from fluffy.kernel.tools.routing import availability
from fluffy.kernel.tools.routing.authorise import authorise, call_paths, size_after
from fluffy.kernel.tools.routing.breaker import BreakerBoard, counts_as_failure
from fluffy.kernel.tools.routing.callaudit import finish, record_execute
from fluffy.kernel.tools.routing.handlers import HANDLERS
from fluffy.kernel.tools.routing.mcpreview import McpCalls, call_mcp
from fluffy.kernel.tools.routing.parallel import PlannedCall
from fluffy.kernel.tools.routing.scheduling import CHANGING_KINDS, run_ordered
from fluffy.kernel.tools.sandbox.pluginjob import PluginOutcome
from fluffy.kernel.tools.sandbox.plugins import PluginRunner
from fluffy.kernel.tools.sandbox.warming import plugin_recipe, repeated_plugin_tools
from fluffy.kernel.tools.testing.testprep import TestPlan, TestPreparer
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.store import SessionRow

log = logging.getLogger("fluffy.kernel.tools")

READ_RETRY_DELAY_S = 0.1
#: Runs a plugin call under the scheduler: (template, call id, coroutine factory,
#: priority).
Schedule = Callable[[str, str, Callable[[], Awaitable[Any]], int], Awaitable[Any]]


async def _direct(
    template: str, key: str, work: Callable[[], Awaitable[Any]], priority: int
) -> Any:
    return await work()


class ToolRouter:
    def __init__(
        self,
        *,
        project: Path,
        registry: Registry,
        fast: FastPath,
        runner: PluginRunner | None,
        workflow: Workflow,
        policy: AuditedPolicy,
        audit: AuditLog | None,
        sanitizer: OutputSanitizer,
        breakers: BreakerBoard,
        workspaces: Workspaces,
        merger: Merger,
        settings: ToolSettings,
        protected: list[str],
        schedule: Schedule = _direct,
        accepting_work: Callable[[], bool] = lambda: True,
        tests: TestPreparer | None = None,
        mcp: McpCalls | None = None,
    ) -> None:
        self.project = project
        self.registry = registry
        self.fast = fast
        self.runner = runner
        self.workflow = workflow
        self.policy = policy
        self.audit = audit
        self.sanitizer = sanitizer
        self.breakers = breakers
        self.workspaces = workspaces
        self.merger = merger
        self.settings = settings
        self.protected = protected
        self.schedule = schedule
        self.accepting_work = accepting_work
        #: orders a batch's dependent calls (None: a private scheduler per batch)
        self.steps: Scheduler | None = None
        #: test.run's environment and per-session view (None: no engine, no test runs)
        self.tests = tests
        #: the project's MCP servers (ADR-046); None: none registered
        self.mcp = mcp
        #: asks the user about a call held for review (set by the session loop)
        self.reviewer: Reviewer | None = None
        #: policy tdd.require_all_green: a failure on the base tree too blocks a merge
        self.require_all_green = False
        #: MCP tools (names) and commands ("container.run ARGV") the user allowed for the
        #: rest of a session, by session id
        self.session_allowed: dict[str, set[str]] = {}
        self.flow = Flow(workflow, workspaces, merger, audit)
        self.scope = availability.WriteScope(
            workflow.test_globs, (*availability.PROTECTED_GLOBS, *protected)
        )

    # -- the public entry points ------------------------------------------------------
    def tools(self) -> list[ToolSpec]:
        return list(self.registry.specs.values())

    async def available(self, session_id: str) -> list[str]:
        session = await self.workflow.get(session_id)
        return availability.available(session.state, session.mode, self.tools())

    async def call(
        self,
        session_id: str,
        tool: str,
        args: Any,
        *,
        call_id: str | None = None,
        priority: int = CALL_PRIORITY,
    ) -> dict[str, Any]:
        started = time.perf_counter()
        client_call_id = call_id
        call_id = uuid.uuid4().hex[:12]  # the kernel's own: it names folders and tasks
        retries = 0
        call: RoutedCall | None = None
        asked: list[dict[str, Any]] = []  # the policy requests decided for this call
        output: dict[str, Any] | FluffyError
        try:
            call = await self._prepare(session_id, tool, args, call_id, asked)
            call.priority = priority
            if call.spec.route == "plugin":  # a long call: its start is on record too
                await record_execute(self.audit, call, attempt=1)
            while True:
                try:
                    output = await self._execute(call)
                    break
                except FluffyError as exc:
                    if not (call.spec.retried and exc.retryable and retries == 0):
                        raise
                    retries += 1
                    await asyncio.sleep(READ_RETRY_DELAY_S)
                    await record_execute(self.audit, call, attempt=2, after=exc)
        except FluffyError as exc:
            output = exc
        except Exception as exc:  # a bug must still be an answer and an audit entry
            log.exception("%s failed unexpectedly", tool)
            output = ToolFailed(
                f"{tool} failed inside the kernel: {type(exc).__name__}",
                why=str(exc)[:500],
                fix="Retry once; if it persists, report it with the kernel's log.",
            )
        answer = await finish(
            call,
            tool=tool,
            session_id=session_id,
            call_id=call_id,
            started=started,
            retries=retries,
            output=output,
            asked=asked,
            args=args,
            sanitizer=self.sanitizer,
            workflow=self.workflow,
            audit=self.audit,
        )
        if client_call_id is not None:
            answer["client_call_id"] = client_call_id
        return answer

    async def batch(
        self, session_id: str, calls: list[dict[str, Any]], *, priority: int = CALL_PRIORITY
    ) -> list[dict[str, Any]]:
        """Several calls of one AI turn: in parallel unless their paths conflict; a call
        that conflicts with earlier ones is submitted depending on them (ADR-043)."""
        tools = [str(item.get("tool")) for item in calls]
        planned, changes = self.plan(tools, [item.get("args") or {} for item in calls])
        await self._expect_batch(session_id, tools)
        return await run_ordered(
            self.steps,
            planned,
            tools,
            changes,
            lambda i: self.call(
                session_id, tools[i], calls[i].get("args") or {}, priority=priority
            ),
            lambda i, exc: self.refused(session_id, tools[i], calls[i].get("args") or {}, exc),
            priority=priority,
        )

    async def _expect_batch(self, session_id: str, tools: list[str]) -> None:
        """A tool asked for several times in a batch: that many sandboxes made ahead."""
        repeated = repeated_plugin_tools(self.registry, tools)
        if not repeated or self.runner is None or self.runner.pool is None:
            return
        try:
            session = await self.workflow.get(session_id)
        except FluffyError:
            return  # the calls themselves will say why
        for tool, count in repeated.items():
            self.expect(session, tool, count)

    def plan(self, tools: list[str], args: list[Any]) -> tuple[list[PlannedCall], list[bool]]:
        """What each call of a response touches, and whether it changes something."""
        planned: list[PlannedCall] = []
        changes: list[bool] = []
        for index, (tool, arguments) in enumerate(zip(tools, args, strict=True)):
            try:
                spec = self.registry.get(tool)
                reads, writes = call_paths(self.fast, spec, arguments)
                changing = spec.kind in CHANGING_KINDS
            except FluffyError:  # the call itself will refuse
                reads, writes, changing = frozenset(), frozenset(), False
            planned.append(PlannedCall(index, reads, writes))
            changes.append(changing)
        return planned, changes

    async def refused(
        self, session_id: str, tool: str, args: Any, error: FluffyError
    ) -> dict[str, Any]:
        """The answer (and tool_result entry) of a call that was never run."""
        call_id = uuid.uuid4().hex[:12]
        started = time.perf_counter()
        return await finish(
            None,
            tool=tool,
            session_id=session_id,
            call_id=call_id,
            started=started,
            retries=0,
            output=error,
            asked=[],
            args=args,
            sanitizer=self.sanitizer,
            workflow=self.workflow,
            audit=self.audit,
        )

    # -- preparing: the checks before anything runs ---------------------------------------
    async def _prepare(
        self, session_id: str, tool: str, args: Any, call_id: str, asked: list[dict[str, Any]]
    ) -> RoutedCall:
        session = await self.workflow.get(session_id)
        spec = self.registry.get(tool)
        args = dict(args) if isinstance(args, dict) else args
        reads, writes = call_paths(self.fast, spec, args)
        if spec.kind == "write" or (spec.kind == "read" and tool.startswith("fs.")):
            # the tool works on the path that was checked (symlinks resolved once)
            args["path"] = next(iter(writes or reads))
        if spec.route in ("fast", "kernel"):
            parse_args(tool, args)  # refuse bad arguments before policy sees them
        if spec.route == "mcp":
            if self.mcp is None:
                raise ToolNotFound(f"there is no MCP tool {tool!r}")
            self.mcp.check_arguments(tool, args)
        if spec.kind != "workflow":
            availability.check(
                tool,
                spec.kind,
                session.state,
                session.mode,
                sorted(writes),
                self.tools(),
                scope=self.scope,
            )
        if spec.route == "plugin" and not self.accepting_work():
            raise KernelOverloaded(
                f"{tool} was not started: the kernel is short of memory",
                fix="Wait for running work to finish, then call again.",
            )
        call = RoutedCall(spec, session, args, call_id, reads, writes)
        size = size_after(call, self.fast, self.workspaces)
        authorise(call, asked, policy=self.policy, size=size)
        if tool == "fs.read":  # however it runs (fast path or the fs plugin's sandbox)
            self.fast.not_secret(next(iter(reads), ""), self.workspaces.get(session.id))
        return call

    # -- executing ----------------------------------------------------------------------
    async def _execute(self, call: RoutedCall) -> dict[str, Any]:
        spec, session = call.spec, call.session
        handler = HANDLERS.get(spec.name)  # the kernel's own part of a built-in tool
        if handler is not None:
            return await handler(self, call)
        stage = self.workspaces.get(session.id)
        if spec.route == "fast" and (self.settings.fast_path or spec.module is None):
            if spec.name.startswith("search."):
                return await asyncio.to_thread(self.fast.run, spec.name, call.args, stage)
            return self.fast.run(spec.name, call.args, stage, normalized=True)
        if spec.route == "fast":  # tools.fast_path: false sends it to its plugin
            call.route = "plugin"
        if spec.route == "mcp":
            return await self._mcp(call)
        outcome = await self.sandbox(call)
        try:
            if spec.kind == "write":
                return await staging.stage(
                    call,
                    outcome,
                    runner=self.runner,
                    policy=self.policy,
                    flow=self.flow,
                    workflow=self.workflow,
                    workspaces=self.workspaces,
                    protected=self.protected,
                    available=self.available,
                )
            return outcome.result
        finally:
            await self.release(outcome)

    async def sandbox(
        self,
        call: RoutedCall,
        test: TestPlan | None = None,
        settings: dict[str, Any] | None = None,
        staged_dir: Path | None = None,
    ) -> PluginOutcome:
        """Run the call in its plugin's sandbox (a test run: in its view and environment)."""
        spec = call.spec
        if self.runner is None or spec.plugin is None or spec.module is None:
            raise EngineUnavailable(
                f"{spec.name} needs a sandbox, and this kernel has no container engine",
                fix="Start Docker or Podman (`scripts/setup`), then restart the kernel.",
            )
        runner, plugin, module = self.runner, spec.plugin, spec.module
        stage = self.workspaces.get(call.session.id)
        project: Path = self.project
        staged: Path | None = stage.root if staged_dir is None else staged_dir
        if test is not None:  # the session's view, one folder (testview)
            project, staged = test.synced.folder, None
        elif self.tests is not None and self.tests.mirror_needed():
            project = await asyncio.to_thread(self._mirror, call, stage)
            staged = staged_dir  # the view carries the staged changes; a commit its record
        ticket = self.breakers.before(plugin)
        try:
            outcome: PluginOutcome = await self.schedule(
                spec.template,
                call.call_id,
                lambda: runner.run(
                    plugin=plugin,
                    module=module,
                    template=spec.template,
                    call_id=call.call_id,
                    tool=spec.name,
                    args=call.args,
                    session_mode=call.session.mode,
                    project=project,
                    staged_dir=staged,
                    timeout_s=self.settings.call_timeout_s,
                    image=test.image if test is not None else None,
                    settings=test.settings if test is not None else settings,
                    capability=call.capability,
                ),
                call.priority,
            )
        except BaseException as exc:
            if counts_as_failure(exc) and not isinstance(exc, KernelOverloaded):
                # the plugin broke (not: the tool said no, or the kernel stopped it)
                self.breakers.failure(ticket, exc)
            else:
                self.breakers.release(ticket)
            raise
        self.breakers.success(ticket)
        call.timings = {k: round(v, 3) for k, v in outcome.timings.items()}
        call.sandbox_id = outcome.sandbox.sandbox_id
        return outcome

    async def _mcp(self, call: RoutedCall) -> dict[str, Any]:
        """An MCP server's tool: the user's yes first when policy asks for review."""
        assert self.mcp is not None
        return await call_mcp(
            call,
            mcp=self.mcp,
            reviewer=self.reviewer,
            session_allowed=self.session_allowed,
            timeout_s=self.settings.call_timeout_s,
        )

    async def release(self, outcome: PluginOutcome) -> None:
        assert self.runner is not None
        await self.runner.release(outcome)

    def expect(self, session: SessionRow, tool: str, count: int = 1) -> None:
        """Warm the pool for the session's next ``count`` ``tool`` calls (sandboxes of
        their recipe); a hint only: whatever goes wrong is logged, never a failure."""
        try:
            self._warm(session, tool, count)
        except Exception:
            log.exception("could not warm a sandbox for %s", tool)

    def _warm(self, session: SessionRow, tool: str, count: int) -> None:
        runner = self.runner
        if runner is None or runner.pool is None:
            return
        if self.tests is not None and self.tests.mirror_needed():
            return  # its sandboxes mount the session's copy, made at the call
        staged = self.workspaces.landed if tool == "git.commit" else self.workspaces.get
        recipe = plugin_recipe(runner, self.registry, tool, self.project,
                               staged(session.id).root, self.settings.call_timeout_s)  # fmt: skip
        if recipe is not None:
            runner.pool.expect(recipe, count)

    def _mirror(self, call: RoutedCall, stage: Any) -> Path:
        """The kernel's copy of the view for a sandbox that cannot read the project."""
        assert self.tests is not None
        git = call.spec.name.startswith("git.") or (
            call.spec.route == "plugin"
            and (call.spec.plugin not in ("fs-tool", "search-tool", "test-tool", "container-tool"))
        )
        return self.tests.mirror(
            call.session.id, stage.overlay(), stage.tree, self.workflow.test_globs, git=git
        )
