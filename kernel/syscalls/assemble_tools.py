"""Build the tool path for a kernel: router, fast path, plugin runner, merge, scheduler.

Installed, enabled third-party plugins are activated here (:mod:`fluffy.kernel.plugins.
activate`): their tools join the registry, their code is handed to the plugin runner,
and the router's policy front tags their calls ``third_party``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import FluffyError
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.confined_files import DEFAULT_SENSITIVE
from fluffy.kernel.containers.runtime import sandbox_identity
from fluffy.kernel.ipc.syscalls import SyscallTable
from fluffy.kernel.mcp.servers import McpServers
from fluffy.kernel.memory_guard import MemoryGuard
from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.plugins.tagging import TaggedPolicy
from fluffy.kernel.policy.audited import AuditedPolicy
from fluffy.kernel.policy.model import PolicyFile
from fluffy.kernel.project.layout import Layout, detect_layout
from fluffy.kernel.syscalls.mcp import mcp_methods
from fluffy.kernel.syscalls.tools import tool_methods
from fluffy.kernel.tools.changes.flow import Flow
from fluffy.kernel.tools.changes.workspace import Workspaces
from fluffy.kernel.tools.core.capabilities import Capabilities
from fluffy.kernel.tools.core.registry import Registry
from fluffy.kernel.tools.reading.fastpath import FastPath, kernel_tools
from fluffy.kernel.tools.reading.sanitizer import OutputSanitizer
from fluffy.kernel.tools.reading.treereader import SessionTree
from fluffy.kernel.tools.routing.breaker import BreakerBoard
from fluffy.kernel.tools.routing.parts import CallChecks, CallRunners
from fluffy.kernel.tools.routing.router import ToolRouter
from fluffy.kernel.tools.routing.scheduling import SchedulerBridge
from fluffy.kernel.tools.sandbox.envfilter import sandbox_environment
from fluffy.kernel.tools.sandbox.plugin_activation import Activated, activate
from fluffy.kernel.tools.sandbox.plugins import PluginRunner
from fluffy.kernel.tools.sandbox.pool import SandboxPool
from fluffy.kernel.tools.sandbox.poolslots import PoolLimits
from fluffy.kernel.tools.sandbox.sandboxes import ImageChooser, KernelSandboxes, audit_observer
from fluffy.kernel.tools.testing.testprep import TestPreparer
from fluffy.kernel.tools.testing.testview import TestViews
from fluffy.kernel.workflow.evidence import MissingProof
from fluffy.kernel.workflow.jsmissing import JsMissingCode
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.missing import MissingCode

log = logging.getLogger("fluffy.kernel.tools")


def sensitive_paths(policy: PolicyFile) -> list[str]:
    """What always waits for a person: fluffy's defaults (keys, CI, git's files, the
    build settings), then the policy's own.  A policy adds to them, never removes: a
    cloned repository can ship a policy that says nothing is sensitive.  So its
    exclusions (``!glob``, which win wherever they stand) are left out: one would take
    paths out of the defaults too."""
    extra = [glob for glob in policy.merge.sensitive_paths or () if not glob.startswith("!")]
    return [*DEFAULT_SENSITIVE, *(glob for glob in extra if glob not in DEFAULT_SENSITIVE)]


def _merger(project: Path, state_dir: Path, policy: PolicyFile, layout: Layout) -> Merger:
    return Merger(
        project,
        state_dir,
        protected=list(policy.merge.protected_paths),
        sensitive=sensitive_paths(policy),
        max_auto_lines=policy.merge.auto_merge_max_lines,
        auto_merge=list(policy.merge.auto_merge_paths),
        roots=layout.merge_globs,
    )


def pool_limits(policy: PolicyFile) -> PoolLimits:
    scheduler = policy.scheduler
    return PoolLimits(
        enabled=scheduler.pool.enabled,
        max_idle=scheduler.pool.max_idle,
        idle_after_s=scheduler.pool.idle_after_s,
        min_free_memory=scheduler.pool.min_free_memory,
        memory_budget_mib=scheduler.pool.memory_budget_mib,
        makers=scheduler.pool.makers,
    )


def _checks(policy: PolicyFile, say: AuditedPolicy, breakers: BreakerBoard) -> CallChecks:
    """What every call is held to under ``policy`` (``say``: the policy engine's front)."""
    return CallChecks(
        policy=say,
        settings=policy.tools,
        sanitizer=_sanitizer(policy),
        breakers=breakers,
        protected=tuple(policy.merge.protected_paths),
        require_all_green=policy.tdd.require_all_green,
    )


def _sanitizer(policy: PolicyFile) -> OutputSanitizer:
    settings = policy.tools
    return OutputSanitizer(
        settings.max_result_tokens, settings.redact_patterns, settings.truncation
    )


class ToolPath(msgspec.Struct):
    router: ToolRouter
    #: the sessions' changes (their workflow, staging areas and merge): the router's too
    flow: Flow
    sandboxes: KernelSandboxes | None
    runner: PluginRunner | None
    scheduler: SchedulerBridge
    plugins: Activated | None = None
    #: the project's MCP servers (ADR-046), the router's ``mcp``; None: no project
    mcp: McpServers | None = None

    def methods(self) -> SyscallTable:
        return SyscallTable(
            tool_methods(self.router, self.flow, self.scheduler.figures),
            mcp_methods(self.router, self.mcp, self.flow.audit),
        )

    def pool_stats(self) -> dict[str, Any] | None:
        """The warm pool's figures (idle sandboxes, taken, missed, ...); None: no pool."""
        pool = self.runner.pool if self.runner is not None else None
        return pool.as_dict() if pool is not None else None

    def environment(self) -> dict[str, Any] | None:
        """The test environment test.run would use now (call off the event loop)."""
        tests = self.router.runners.tests
        choice = tests.environment() if tests is not None else None
        return choice.to_dict() if choice is not None else None

    def reload(self, policy: PolicyFile) -> None:
        """A policy update: new sanitiser, merge rules and tool settings."""
        router = self.router
        router.hold_to(_checks(policy, router.checks.policy, router.checks.breakers))
        self.flow.merger.configure(
            list(policy.merge.protected_paths),
            sensitive_paths(policy),
            policy.merge.auto_merge_max_lines,
            list(policy.merge.auto_merge_paths),
        )
        router.fast.read_max_bytes = policy.tools.read_max_bytes
        if self.runner is not None and self.runner.pool is not None:
            self.runner.pool.limits = pool_limits(policy)
            self.runner.pool.invalidate("the policy was reloaded")

    def sweep(self) -> None:
        """Start-up recovery in the background: the sandboxes an earlier kernel of this
        project left behind (the kernel calls it once it listens: the sweep connects to
        the engine, importing its SDK, which the start need not wait for)."""
        if self.sandboxes is not None:
            threading.Thread(target=_remove_orphans, args=(self.sandboxes,), daemon=True).start()

    async def close(self) -> None:
        if self.mcp is not None:
            await self.mcp.close()
        await self.scheduler.close()
        if self.runner is not None:
            await self.runner.close()
        if self.sandboxes is not None:
            await asyncio.to_thread(self.sandboxes.close)
        if self.plugins is not None:
            await self.plugins.close()


async def assemble_tools(
    state_dir: Path,
    project: Path | None,
    policy: PolicyFile,
    workflow: Workflow,
    front: AuditedPolicy,
    audit: AuditLog | None,
    guard: MemoryGuard,
    *,
    engine: bool = True,
    layout: Layout | None = None,
    images: ImageChooser | None = None,
) -> ToolPath:
    root = project or state_dir
    layout = layout or detect_layout(root)
    workspaces = Workspaces(state_dir, root)
    workflow.overlay = workspaces.overlay
    merger = _merger(root, state_dir, policy, layout)
    sandboxes = (
        KernelSandboxes(state_dir, project, images=images)
        if engine and project is not None
        else None
    )
    if sandboxes is not None and audit is not None:
        sandboxes.observer = audit_observer(audit, asyncio.get_running_loop())
    runner = (
        PluginRunner(
            sandboxes.manager,
            state_dir,
            environment=lambda: sandbox_environment().env,
            audit=audit,
        )
        if sandboxes is not None
        else None
    )
    registry = Registry.builtin(kernel_tools())
    plugins = await activate(state_dir, registry, front.engine.evaluate, audit)
    registry.add(plugins.specs)
    mcp = _mcp_servers(project, sandboxes, audit, registry)
    if runner is not None:
        runner.third_party = plugins.code
        # one token store: a reloaded engine shares it (PolicyEngine.with_policy)
        runner.capabilities = Capabilities(front.engine.tokens, front.engine.clock, audit)

    def accepting_work() -> bool:
        return guard.accepting_work

    if runner is not None:
        guard.evictors.append(runner.evict)  # 90 %: destroy running plugin sandboxes
        runner.pool = SandboxPool(
            runner, pool_limits(policy), kernel_pressure=lambda: not guard.accepting_work
        )
        guard.shedders.append(runner.pool.drain)  # 80 %: no idle sandboxes
        workspaces.on_discard.append(lambda folder: _forget(runner, folder))
    scheduler = SchedulerBridge(
        policy.scheduler, runner, accepting_work, memory_usage=lambda: guard.ratio
    )
    await scheduler.start()
    if runner is not None and runner.pool is not None:  # its making counts (ADR-043/065)
        runner.pool.slots = scheduler
        scheduler.on_finish.append(runner.pool.nudge)  # a slot is free: refill now
    fast = FastPath(root, policy.tools.read_max_bytes)
    tests = TestPreparer(
        root,
        state_dir,
        layout,
        TestViews(state_dir, root, sandbox_identity()[0]),
        base_image=lambda: _base_image(sandboxes) if sandboxes is not None else None,
    )
    roots = (*layout.import_roots(), ".", *layout.test_roots)

    def missing_code(session_id: str) -> MissingProof:
        if layout.language == "javascript":
            return JsMissingCode(  # the whole project: code lives beside the roots too
                SessionTree(fast, workspaces.get(session_id)), (*layout.source_roots, ".")
            ).proves
        judge = MissingCode(
            SessionTree(fast, workspaces.get(session_id)), roots, third_party=tests.third_party()
        )
        return judge.proves

    workflow.missing_code = missing_code
    flow = Flow(workflow, workspaces, merger, audit)
    router = ToolRouter(
        project=root,
        registry=registry,
        fast=fast,
        flow=flow,
        checks=_checks(policy, TaggedPolicy(front, lambda: plugins.names), BreakerBoard()),
        runners=CallRunners(
            plugins=runner,
            schedule=scheduler.schedule,
            steps=scheduler.scheduler,  # a batch's dependent calls (ADR-043)
            accepting_work=accepting_work,
            tests=tests,
            mcp=mcp,
        ),
    )
    try:
        finished = await flow.resume()  # merges a crash interrupted complete now
        if finished:
            log.warning("completed interrupted merges of session(s) %s", ", ".join(finished))
    except FluffyError as exc:
        log.error("could not complete an interrupted merge: %s", exc)
    return ToolPath(router, flow, sandboxes, runner, scheduler, plugins, mcp)


def _mcp_servers(
    project: Path | None,
    sandboxes: KernelSandboxes | None,
    audit: AuditLog | None,
    registry: Registry,
) -> McpServers | None:
    """The project's MCP servers (ADR-046); their tools join the registry."""
    if project is None:
        return None
    servers = McpServers(
        project,
        sandboxes.manager if sandboxes is not None else None,
        record=audit.record_nowait if audit is not None else None,
    )
    try:
        registry.add(servers.load())
    except FluffyError as exc:  # a name taken by a plugin: the servers' tools stay out
        log.error("MCP servers' tools not offered: %s", exc.what)
    return servers


def _forget(runner: PluginRunner, folder: Path) -> None:
    if runner.pool is not None:
        runner.pool.invalidate(f"{folder.name} was removed", folder=folder)


def _base_image(sandboxes: KernelSandboxes) -> str | None:
    """The code-executor image project environments are built FROM (None: no engine)."""
    try:
        return sandboxes.manager().images.get("code-executor")
    except FluffyError:
        return None


def _remove_orphans(sandboxes: KernelSandboxes) -> None:
    """Start-up recovery: sandboxes an earlier kernel of this project left behind."""
    try:
        removed = sandboxes.remove_orphans()
    except FluffyError as exc:
        sandboxes.error = exc
        log.warning("orphan sandbox clean-up skipped: %s", exc.what)
        return
    if removed:
        log.warning("removed %d orphan sandbox(es) of this project", len(removed))
