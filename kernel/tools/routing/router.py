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
from fluffy.kernel.tools.changes import staging
from fluffy.kernel.tools.changes.flow import Flow
from fluffy.kernel.tools.core.registry import Registry, ToolSpec
from fluffy.kernel.tools.core.routedcall import CALL_PRIORITY, Reviewer, RoutedCall
from fluffy.kernel.tools.reading.fastpath import FastPath, parse_args
from fluffy.kernel.tools.routing import availability
from fluffy.kernel.tools.routing.authorise import authorise, call_paths, size_after
from fluffy.kernel.tools.routing.breaker import counts_as_failure
from fluffy.kernel.tools.routing.callaudit import finish, record_execute
from fluffy.kernel.tools.routing.handlers import HANDLERS
from fluffy.kernel.tools.routing.mcpreview import call_mcp
from fluffy.kernel.tools.routing.parallel import PlannedCall
from fluffy.kernel.tools.routing.parts import CallChecks, CallRunners
from fluffy.kernel.tools.routing.scheduling import CHANGING_KINDS, run_in_turn, run_ordered
from fluffy.kernel.tools.sandbox.pluginjob import PluginOutcome
from fluffy.kernel.tools.sandbox.warming import plugin_recipe, repeated_plugin_tools
from fluffy.kernel.tools.testing.testprep import TestPlan
from fluffy.kernel.workflow.store import SessionRow

log = logging.getLogger("fluffy.kernel.tools")

READ_RETRY_DELAY_S = 0.1


class ToolRouter:
    """Routes the calls of ``project``'s sessions: ``registry`` names the tools, ``fast``
    answers reads in the kernel, ``flow`` is the session's change (its workflow, staging
    area and merge), ``checks`` what every call is held to, ``runners`` where a call that
    leaves the kernel runs."""

    def __init__(
        self,
        *,
        project: Path,
        registry: Registry,
        fast: FastPath,
        flow: Flow,
        checks: CallChecks,
        runners: CallRunners,
    ) -> None:
        self.project = project
        self.registry = registry
        self.fast = fast
        self.flow = flow
        self.workflow = flow.workflow
        self.workspaces = flow.workspaces
        self.audit = flow.audit
        self.runners = runners
        #: asks the user about a call held for review (the session loop's, ``review_with``)
        self.reviewer: Reviewer | None = None
        #: MCP tools (names) and commands ("container.run ARGV") the user allowed for the
        #: rest of a session, by session id
        self.session_allowed: dict[str, set[str]] = {}
        self.hold_to(checks)

    def hold_to(self, checks: CallChecks) -> None:
        """Every later call is held to ``checks`` (at start, and on a policy reload)."""
        self.checks = checks
        self.scope = availability.WriteScope(
            self.workflow.test_globs, (*availability.PROTECTED_GLOBS, *checks.protected)
        )

    def status(self) -> dict[str, Any]:
        """The plugins' circuit breakers, and whether reads take the fast path."""
        return {
            "breakers": {k: v.to_dict() for k, v in self.checks.breakers.snapshot().items()},
            "fast_path": self.checks.settings.fast_path,
        }

    def spec(self, tool: str) -> ToolSpec | None:
        """The tool named ``tool``; None when there is none."""
        return self.registry.specs.get(tool)

    def offer_mcp(self, prefix: str, specs: list[ToolSpec], forget: Callable[[str], bool]) -> None:
        """The MCP tools (names under ``prefix``) are now ``specs``; a person's yes for a
        tool ``forget`` names (its server changed) was for the server as it was: gone."""
        self.registry.replace(prefix, specs)
        for allowed in self.session_allowed.values():
            allowed.difference_update({tool for tool in allowed if forget(tool)})

    def review_with(self, reviewer: Reviewer) -> None:
        """Calls held for review are asked of the person through ``reviewer``."""
        self.reviewer = reviewer

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
            sanitizer=self.checks.sanitizer,
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
        return await self.ordered(
            planned,
            tools,
            changes,
            lambda i: self.call(
                session_id, tools[i], calls[i].get("args") or {}, priority=priority
            ),
            lambda i, exc: self.refused(session_id, tools[i], calls[i].get("args") or {}, exc),
            priority=priority,
        )

    async def ordered(
        self,
        planned: list[PlannedCall],
        tools: list[str],
        changes: list[bool],
        one: Callable[[int], Awaitable[dict[str, Any]]],
        refuse: Callable[[int, FluffyError], Awaitable[dict[str, Any]]],
        *,
        priority: int,
    ) -> list[dict[str, Any]]:
        """Run a response's calls (``one(i)``) in parallel unless their paths conflict, a
        conflicting call after those it depends on; ``refuse(i, error)`` answers a call
        whose dependency failed (ADR-043).  Reads the kernel answers on the loop's own
        thread run one after the other, outside the scheduler (ADR-100), unless the
        memory guard holds new work (the scheduler then holds them too)."""
        if self.runners.accepting_work() and all(self._on_the_loop(t) for t in tools):
            return await run_in_turn(len(tools), one, refuse)
        return await run_ordered(
            self.runners.steps, planned, tools, changes, one, refuse, priority=priority
        )

    def _on_the_loop(self, tool: str) -> bool:
        """A fast read served on the loop's own thread: no sandbox, no worker thread
        (``search.*`` runs on one), no kernel handler, and the fast path on."""
        spec = self.registry.specs.get(tool)
        return (
            spec is not None
            and spec.route == "fast"
            and spec.kind == "read"
            and not spec.name.startswith("search.")
            and spec.name not in HANDLERS
            and (self.checks.settings.fast_path or spec.module is None)
        )

    async def _expect_batch(self, session_id: str, tools: list[str]) -> None:
        """A tool asked for several times in a batch: that many sandboxes made ahead."""
        repeated = repeated_plugin_tools(self.registry, tools)
        if not repeated or self.runners.plugins is None or self.runners.plugins.pool is None:
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
            sanitizer=self.checks.sanitizer,
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
            if self.runners.mcp is None:
                raise ToolNotFound(f"there is no MCP tool {tool!r}")
            self.runners.mcp.check_arguments(tool, args)
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
        if spec.route == "plugin" and not self.runners.accepting_work():
            raise KernelOverloaded(
                f"{tool} was not started: the kernel is short of memory",
                fix="Wait for running work to finish, then call again.",
            )
        call = RoutedCall(spec, session, args, call_id, reads, writes)
        size = size_after(call, self.fast, self.workspaces)
        authorise(call, asked, policy=self.checks.policy, size=size)
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
        if spec.route == "fast" and (self.checks.settings.fast_path or spec.module is None):
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
                    runner=self.runners.plugins,
                    policy=self.checks.policy,
                    flow=self.flow,
                    workflow=self.workflow,
                    workspaces=self.workspaces,
                    protected=list(self.checks.protected),
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
        if self.runners.plugins is None or spec.plugin is None or spec.module is None:
            raise EngineUnavailable(
                f"{spec.name} needs a sandbox, and this kernel has no container engine",
                fix="Start Docker or Podman (`scripts/setup`), then restart the kernel.",
            )
        runner, plugin, module = self.runners.plugins, spec.plugin, spec.module
        stage = self.workspaces.get(call.session.id)
        project: Path = self.project
        staged: Path | None = stage.root if staged_dir is None else staged_dir
        if test is not None:  # the session's view, one folder (testview)
            project, staged = test.synced.folder, None
        elif self.runners.tests is not None and self.runners.tests.mirror_needed():
            project = await asyncio.to_thread(self._mirror, call, stage)
            staged = staged_dir  # the view carries the staged changes; a commit its record
        ticket = self.checks.breakers.before(plugin)
        try:
            outcome: PluginOutcome = await self.runners.schedule(
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
                    timeout_s=self.checks.settings.call_timeout_s,
                    image=test.image if test is not None else None,
                    settings=test.settings if test is not None else settings,
                    capability=call.capability,
                ),
                call.priority,
            )
        except BaseException as exc:
            if counts_as_failure(exc) and not isinstance(exc, KernelOverloaded):
                # the plugin broke (not: the tool said no, or the kernel stopped it)
                self.checks.breakers.failure(ticket, exc)
            else:
                self.checks.breakers.release(ticket)
            raise
        self.checks.breakers.success(ticket)
        call.timings = {k: round(v, 3) for k, v in outcome.timings.items()}
        call.sandbox_id = outcome.sandbox.sandbox_id
        return outcome

    async def _mcp(self, call: RoutedCall) -> dict[str, Any]:
        """An MCP server's tool: the user's yes first when policy asks for review."""
        assert self.runners.mcp is not None
        return await call_mcp(
            call,
            mcp=self.runners.mcp,
            reviewer=self.reviewer,
            session_allowed=self.session_allowed,
            timeout_s=self.checks.settings.call_timeout_s,
        )

    async def release(self, outcome: PluginOutcome) -> None:
        assert self.runners.plugins is not None
        await self.runners.plugins.release(outcome)

    def expect(self, session: SessionRow, tool: str, count: int = 1) -> None:
        """Warm the pool for the session's next ``count`` ``tool`` calls (sandboxes of
        their recipe); a hint only: whatever goes wrong is logged, never a failure."""
        try:
            self._warm(session, tool, count)
        except Exception:
            log.exception("could not warm a sandbox for %s", tool)

    def _warm(self, session: SessionRow, tool: str, count: int) -> None:
        runner = self.runners.plugins
        if runner is None or runner.pool is None:
            return
        if self.runners.tests is not None and self.runners.tests.mirror_needed():
            return  # its sandboxes mount the session's copy, made at the call
        staged = self.workspaces.landed if tool == "git.commit" else self.workspaces.get
        recipe = plugin_recipe(
            runner,
            self.registry,
            tool,
            self.project,
            staged(session.id).root,
            self.checks.settings.call_timeout_s,
        )
        if recipe is not None:
            runner.pool.expect(recipe, count)

    def _mirror(self, call: RoutedCall, stage: Any) -> Path:
        """The kernel's copy of the view for a sandbox that cannot read the project."""
        assert self.runners.tests is not None
        git = call.spec.name.startswith("git.") or (
            call.spec.route == "plugin"
            and (call.spec.plugin not in ("fs-tool", "search-tool", "test-tool", "container-tool"))
        )
        return self.runners.tests.mirror(
            call.session.id, stage.overlay(), stage.tree, self.workflow.test_globs, git=git
        )
