"""``fluffy kernel serve``: the kernel process in the foreground (development, tests).

Start-up runs the database checks (integrity, recovery, chain verification), opens the
audit log and records ``kernel_start`` plus anything the checks found; then it listens
on one Unix socket (0600 in a 0700 folder) and audits every call.  SIGTERM or SIGINT
shut it down cleanly: ``kernel_shutdown`` recorded, the buffer flushed, a backup
taken.  In production bootstrap starts the same process inside the L1 container.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from fluffy import __version__
from fluffy.errors import ConfigError
from fluffy.kernel import process_tuning
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.observer import SyscallAuditor
from fluffy.kernel.audit.recovery import (
    StartupCheck,
    chain_check,
    chain_unverified,
    check_database,
    take_backup,
)
from fluffy.kernel.audit.storage import StorageSettings
from fluffy.kernel.audit.verify import Found
from fluffy.kernel.ipc.server import KernelServer, Limits
from fluffy.kernel.ipc.syscalls import SyscallTable
from fluffy.kernel.memory_guard import MemoryGuard
from fluffy.kernel.policy.audited import AuditedPolicy
from fluffy.kernel.policy.builtin import default_builtins
from fluffy.kernel.policy.engine import PolicyEngine
from fluffy.kernel.policy.model import PolicyFile
from fluffy.kernel.policy.rules import BrokenRules, ProjectRules, rules_dir
from fluffy.kernel.project.defaults import project_policy
from fluffy.kernel.project.layout import Layout, detect_layout
from fluffy.kernel.syscalls.assemble_ai import AiLayer, assemble_ai
from fluffy.kernel.syscalls.assemble_tools import ToolPath, assemble_tools
from fluffy.kernel.syscalls.audit import audit_methods
from fluffy.kernel.syscalls.kernel import default_methods, witnessed
from fluffy.kernel.syscalls.plugins import plugin_methods
from fluffy.kernel.syscalls.policy import policy_methods
from fluffy.kernel.syscalls.project import project_methods
from fluffy.kernel.syscalls.workflow import workflow_methods
from fluffy.kernel.tools.sandbox.sandboxes import ImageChooser
from fluffy.kernel.workflow.evidence import DEFAULT_TEST_GLOBS
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.store import WorkflowStore

log = logging.getLogger("fluffy.kernel")


async def open_audit(state_dir: Path, settings: StorageSettings | None = None) -> AuditLog:
    """:func:`start_audit` with the chain verified before the log opens."""
    audit, _ = await start_audit(state_dir, settings, chain=True)
    return audit


async def start_audit(
    state_dir: Path, settings: StorageSettings | None = None, *, chain: bool = False
) -> tuple[AuditLog, StartupCheck]:
    """The start-up sequence's database step: check, recover, open, record what happened.

    ``chain=False``: a healthy database's chain is left to :func:`verify_chain`, with
    the head its files claimed before ``kernel_start`` rewrote them (``check.found``)."""
    check = await asyncio.to_thread(check_database, state_dir, chain=chain)
    if check.outcome != "ok":
        log.warning("audit database: %s", check.detail)
    audit = await AuditLog.open(state_dir, settings=settings)  # policy.yaml `audit:`
    await audit.record(
        Event(
            "kernel_start",
            input_summary=f"kernel {__version__} started; database: {check.detail}",
            metadata={"database": check.outcome, "version": __version__},
        )
    )
    for event in check.events:
        await audit.record(event)
    return audit, check


async def verify_chain(audit: AuditLog, state_dir: Path, found: Found | None) -> None:
    """The chain verification of the kernel's start, once it serves (design: a break is
    logged, it never blocks the start): a break is recorded as ``audit_chain_break``,
    and so is a check that could not be made (a damaged archive).  No archive is made
    or deleted meanwhile: the check reads them."""
    audit.storage_held = True
    try:
        check = await asyncio.to_thread(chain_check, state_dir, found)
    except Exception as exc:  # verify raises on a damaged file: said, never lost
        log.exception("the audit chain could not be verified")
        check = chain_unverified(exc)
    finally:
        audit.storage_held = False
    if check.outcome != "ok":
        log.warning("audit database: %s", check.detail)
    for event in check.events:
        await audit.record(event)


async def load_rules(
    project: Path | None,
    state_dir: Path,
    policy: PolicyFile,
    tools: ToolPath,
    front: AuditedPolicy,
    audit: AuditLog,
) -> ProjectRules | None:
    """The project's extension rules (``.fluffy/rules/*.py``), loaded into a warmed
    policy sandbox before the kernel serves; a set that cannot load denies what it would
    have judged, and the audit log says why."""
    if project is None:
        return None
    sandboxes = tools.sandboxes
    rules = ProjectRules(
        rules_dir(project),
        sandboxes.manager if sandboxes is not None else None,
        state_dir / "rules",
        reserve=tools.scheduler.reserver("policy-sandbox", "validate"),
    )
    loaded = await asyncio.to_thread(rules.load)  # the policy sandbox's entry: its own
    if loaded:
        front.swap(front.engine.with_policy(policy, loaded))
    if isinstance(rules.host, BrokenRules):
        names = ", ".join(sorted(p.name for p in rules.folder.glob("*.py"))) or "(none)"
        await audit.record(
            Event(
                "policy_rule_failed",
                caller="kernel",
                policy_decision="denied",
                policy_rule_name="extension-rules",
                deny_reason=rules.host.reason[:500],
                input_summary=f"extension rules {names} did not load: every decision "
                "they would judge is denied",
                metadata={"rules": names},
            )
        )
    return rules


def kernel_syscalls(
    *,
    workflow: Workflow,
    accepting_work: Callable[[], bool],
    front: AuditedPolicy,
    policy_path: Path | None,
    state_dir: Path,
    audit: AuditLog,
    reloaded: Callable[[PolicyFile], None],
    default_text: str | None,
    rules: ProjectRules | None,
    project: Path | None,
    layout: Layout | None,
    tools: ToolPath,
    ai: AiLayer,
) -> SyscallTable:
    """The kernel's syscall table: every feature's declarations joined into one closed
    set (a name declared twice raises :class:`DuplicateSyscall` here, at start-up)."""
    return SyscallTable(
        default_methods(),
        audit_methods(audit),
        workflow_methods(workflow, accepting_work),
        policy_methods(front, policy_path, state_dir, audit, reloaded, default_text, rules),
        project_methods(project, layout, default_text is not None, tools.environment),
        plugin_methods(front, audit, state_dir, lambda: tools.plugins),
        ai.methods(tools.methods()),
    )


async def serve(
    socket_path: Path,
    state_dir: Path,
    project: Path | None = None,
    limits: Limits | None = None,
    images: ImageChooser | None = None,
) -> int:
    if project is not None and not project.is_dir():
        raise ConfigError(
            f"project directory {project} does not exist",
            fix="Pass an existing directory with --project.",
            why="the kernel serves one existing project folder",
        )
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    policy, default_text = project_policy(project)  # a bad policy file blocks start-up
    layout = detect_layout(project) if project is not None else None
    # what is opened is closed in reverse, whether the kernel stops or its start fails
    async with contextlib.AsyncExitStack() as opened:
        # integrity check, recovery first; the chain once the kernel serves
        audit, check = await start_audit(state_dir, policy.audit)
        opened.push_async_callback(_close_audit, audit, state_dir)
        store = await WorkflowStore.open(state_dir)
        opened.push_async_callback(store.close)
        front = AuditedPolicy(
            PolicyEngine(policy, builtins=default_builtins(project), root=project), audit
        )
        workflow = Workflow(
            store,
            project or state_dir,
            audit=audit,
            policy=front,
            exemptions=policy.exemptions,
            tech_debt=policy.tech_debt,
            test_globs=layout.test_globs if layout is not None else DEFAULT_TEST_GLOBS,
            language=layout.language if layout is not None else "python",
            on_session_end=lambda: asyncio.to_thread(take_backup, state_dir),
        )
        guard = MemoryGuard()
        tools = await assemble_tools(
            state_dir, project, policy, workflow, front, audit, guard, layout=layout, images=images
        )
        opened.push_async_callback(tools.close)
        ai = await assemble_ai(state_dir, policy, tools, audit)
        opened.push_async_callback(ai.close)
        rules = await load_rules(project, state_dir, policy, tools, front, audit)
        if rules is not None:
            opened.push_async_callback(asyncio.to_thread, rules.close)

        def reloaded(new: PolicyFile) -> None:
            workflow.exemptions = new.exemptions
            workflow.tech_debt = new.tech_debt
            tools.reload(new)
            ai.reload(new)

        guard.check()
        watcher = asyncio.create_task(guard.watch(), name="memory-guard")
        opened.callback(watcher.cancel)
        policy_path = project / ".fluffy" / "policy.yaml" if project is not None else None
        methods = kernel_syscalls(
            workflow=workflow,
            accepting_work=lambda: guard.accepting_work,
            front=front,
            policy_path=policy_path,
            state_dir=state_dir,
            audit=audit,
            reloaded=reloaded,
            default_text=default_text,
            rules=rules,
            project=project,
            layout=layout,
            tools=tools,
            ai=ai,
        )
        server = KernelServer(methods, limits or Limits())
        server.observer = SyscallAuditor(audit, lambda: workflow.current)
        server.audit_head = witnessed(audit)
        server.memory = lambda: {**guard.as_dict(), "pool": tools.pool_stats()}
        server.scheduler = tools.scheduler.figures
        opened.push_async_callback(server.close)
        await server.listen(socket_path)
        if check.deferred:
            verifying = verify_chain(audit, state_dir, check.found)
            opened.push_async_callback(_finish, asyncio.create_task(verifying))
        tools.sweep()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
            opened.callback(loop.remove_signal_handler, sig)
        print(f"fluffy kernel listening on {socket_path}", file=sys.stderr, flush=True)
        process_tuning.settled()
        await stop.wait()
    print("fluffy kernel stopped", file=sys.stderr, flush=True)
    return 0


async def _finish(task: asyncio.Task[None]) -> None:
    """At shutdown: the start's chain check ends first (a break it found is recorded
    before ``kernel_shutdown``); a failed check is logged, never raised."""
    try:
        await task
    except Exception:
        log.exception("the audit chain check failed")


async def _close_audit(audit: AuditLog, state_dir: Path) -> None:
    """The log's last entry, the log closed, then the state database backed up."""
    await audit.record(Event("kernel_shutdown", input_summary="kernel stopped"))
    await audit.close()
    await asyncio.to_thread(take_backup, state_dir)


def main(
    socket_path: Path, state_dir: Path, project: Path | None, images: ImageChooser | None = None
) -> int:
    """Serve until stopped; ``images`` chooses the sandboxes' images (None: in L1, by
    FLUFFY_IMAGES or label; see :func:`~fluffy.kernel.tools.sandbox.sandboxes.sandbox_images`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    process_tuning.tune()
    process_tuning.starting()
    try:
        return asyncio.run(serve(socket_path, state_dir, project, images=images))
    finally:
        process_tuning.settled()  # (a start that failed: collect again)
