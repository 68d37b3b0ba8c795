"""The plugin host's side of a call: its socket, its staged code, its answer.

A plugin's socket serves ``tool.next``, ``tool.files`` and ``tool.result`` only
(:class:`PluginSocket`), declared like the kernel's syscalls (typed params, decoded
strictly before a handler runs; callable on a plugin sandbox's own socket only);
anything else it calls is denied and audited.  A third-party
plugin's verified files are written into the call folder by :func:`stage_code`, and
:func:`await_reply` waits for the host to connect and answer.  The sandboxes themselves
are made and torn down by :class:`~fluffy.kernel.tools.sandbox.plugins.PluginRunner`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import (
    FluffyError,
    InvalidPayload,
    PolicyDenied,
    SandboxExited,
    ToolTimeout,
    ToolTransient,
)
from fluffy.ipc.results.sandbox import ToolJob
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.observer import SyscallAuditor
from fluffy.kernel.containers.lifecycle import Sandbox
from fluffy.kernel.containers.manager import KERNEL_SOCKET_TARGET
from fluffy.kernel.containers.runtime import ContainerRuntime
from fluffy.kernel.containers.sandboxio import output_tail
from fluffy.kernel.ipc.server import CallContext, CallRecord, note_decision
from fluffy.kernel.ipc.syscalls import NoParams, OwnSocket, Syscall, SyscallTable
from fluffy.kernel.plugins.handshake import check_negotiated
from fluffy.kernel.tools.core.capabilities import Capabilities
from fluffy.kernel.tools.sandbox.callfiles import WRITER, FilesParams, parse_files, write_files
from fluffy.kernel.tools.sandbox.pluginjob import (
    DECLARED_TOOLS,
    PLUGIN_CODE_DIR,
    Job,
    ThirdPartyCode,
    connection_key,
    first_done,
)

#: A plugin's sandbox, on its own socket (bindings ``tool:PLUGIN:SLOT``).
PLUGIN_SANDBOX = OwnSocket("tool", "a plugin sandbox")


class ToolResultParams(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``tool.result``: the answer to the call (:mod:`fluffy.plugins.sdk.execute`)."""

    call_id: str
    ok: bool
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # {code, message, retryable}
    duration_ms: float | None = None


class PluginSocket:
    """The methods a plugin's socket serves, over the runner's calls (``jobs``, by the
    socket's binding)."""

    def __init__(self, jobs: dict[str, Job], audit: AuditLog | None) -> None:
        self.jobs = jobs
        self.audit = audit
        #: Active third-party plugins by name (set by the kernel at start-up).
        self.third_party: dict[str, ThirdPartyCode] = {}
        #: Issues the capability tokens of calls that write (None: no tokens).
        self.capabilities: Capabilities | None = None

    def job_of(self, context: CallContext) -> Job:
        job = self.jobs.get(context.binding)
        if job is None:
            raise InvalidPayload("this socket has no tool call")
        return job

    async def next(self, context: CallContext, params: NoParams) -> dict[str, Any] | None:
        job = self.job_of(context)
        job.waiting.set()
        try:
            await job.placed.wait()  # a call is assigned (a pooled sandbox waits here)
        except asyncio.CancelledError:
            if not job.placed.is_set():
                job.lost = True  # the host hung up while idle: never hand this one out
            raise
        if job.handed:  # one call per sandbox: the host exits on None
            return None
        check_negotiated(job.plugin, context.api_version, job.min_api_version)
        job.handed = True
        job.context = context
        job.handed_at = time.perf_counter()
        job.connected.set()
        work: dict[str, Any] = {
            "call_id": job.call_id,
            "tool": job.tool,
            "args": job.args,
            "session_mode": job.session_mode,
            "sandbox_id": job.sandbox_id,
        }
        if job.settings:
            work["settings"] = job.settings
        if job.capability is not None and self.capabilities is not None:
            work["capability"] = await self.issue(job, context)
        return work

    async def issue(self, job: Job, context: CallContext) -> dict[str, Any]:
        """The call's token, bound to this sandbox and the connection that took it."""
        assert job.capability is not None and self.capabilities is not None
        container_id = job.sandbox.container_id if job.sandbox is not None else None
        # handed out at once; its issue's durable commit overlaps the tool's run, and
        # the call's result (where the token's uses come back) waits for it
        token, job.issued = self.capabilities.begin_issue(
            job.capability,
            container_id=container_id or job.sandbox_id,
            connection=connection_key(context),
            ttl_s=job.timeout_s or 30.0,
            call_id=job.call_id,
            plugin=job.plugin,
            sandbox_id=job.sandbox_id,
        )
        if self.jobs.get(context.binding) is not job:  # torn down while it was recorded
            self.capabilities.expire(token.token_id, job.call_id, why="the call ended first")
        else:
            job.token = token
        return {
            "token": token.token_id,
            "syscall": token.syscall,
            "paths": sorted(token.paths or ()),
            "max_ops": token.max_ops,
        }

    def taker(self, context: CallContext, method: str) -> Job:
        """The call, if ``context`` is the connection that took it and it is unanswered:
        code the call runs (a test) can reach the same socket, but cannot answer or send
        files in the plugin's name."""
        job = self.job_of(context)
        if job.context is None or context.connection is not job.context.connection:
            raise InvalidPayload(
                f"{method} must come from the connection that took the call (tool.next)"
            )
        if job.future.done():
            raise InvalidPayload("this call was answered already")
        return job

    async def files(self, context: CallContext, params: FilesParams) -> None:
        job = self.taker(context, "tool.files")
        if job.files_refused is not None:
            raise InvalidPayload(f"this call's files were refused already: {job.files_refused}")
        if job.sending.locked() or job.sandbox is None:
            raise InvalidPayload("tool.files comes one frame at a time, after tool.next")
        async with job.sending:
            try:
                pieces = parse_files(params, job.call_id)
                folder = job.sandbox.output_dir / job.call_id
                await asyncio.get_running_loop().run_in_executor(
                    WRITER, write_files, folder, pieces, job.received
                )
            except InvalidPayload as exc:
                job.files_refused = exc.what
                raise

    async def result(self, context: CallContext, params: ToolResultParams) -> None:
        job = self.taker(context, "tool.result")
        if params.call_id != job.call_id:
            raise InvalidPayload("tool.result must name the call it answers (call_id)")
        async with job.sending:  # the files in flight are written first
            if job.future.done():
                raise InvalidPayload("this call was answered already")
            reply: dict[str, Any] = msgspec.to_builtins(params)  # the fields sent
            if job.issued is not None:
                try:
                    await job.issued  # no use of the token before its issue is durable
                except FluffyError as exc:
                    reply = {"call_id": job.call_id, "ok": False, "error": {
                        "code": exc.code, "message": f"the call's token: {exc.what}"}}  # fmt: skip
                if job.future.done():  # the call ended meanwhile (torn down, evicted)
                    raise InvalidPayload("this call was answered already")
            if job.files_refused is not None:  # the call failed: its files are incomplete
                reply = {
                    "call_id": job.call_id,
                    "ok": False,
                    "error": {
                        "code": "tool.failed",
                        "message": f"the call's output files were refused: {job.files_refused}",
                    },
                }
            job.future.set_result(reply)

    # -- the socket: its methods, everything else denied and audited ------------------
    def methods(self, plugin: str) -> SyscallTable:
        """The socket's table for ``plugin``'s sandbox: every other name is denied."""
        code = self.third_party.get(plugin)
        declared = code.capabilities if code is not None else ()

        def deny(context: CallContext, method: str) -> None:
            if method in declared:
                reason = (
                    f"{method} is among {plugin}'s required capabilities, but a plugin's "
                    "socket serves tool.next, tool.files and tool.result only"
                )
            else:
                reason = (
                    f"{method} is not among {plugin}'s required capabilities "
                    f"({', '.join(declared) or 'none declared'})"
                )
            note_decision("denied", "kernel.plugin_socket", reason)
            raise PolicyDenied(
                f"plugin {plugin} may not call {method}",
                why=reason,
                fix="A plugin works through its ToolContext (the view, its output "
                "folder, commands in its sandbox); its socket has no other syscalls.",
            )

        own = PLUGIN_SANDBOX
        return SyscallTable(
            [
                Syscall("tool.next", NoParams, self.next, ToolJob | None, since=1, callers=own),
                Syscall("tool.files", FilesParams, self.files, None, since=1, callers=own),
                Syscall("tool.result", ToolResultParams, self.result, None, since=1, callers=own),
            ],
            undeclared=deny,
        )

    def observer(self) -> Callable[[CallRecord], None] | None:
        """Audits what a plugin's socket refused (its two own methods are not entries)."""
        if self.audit is None:
            return None
        auditor = SyscallAuditor(self.audit)

        def observe(record: CallRecord) -> None:
            if record.decision == "denied":
                auditor(record)

        return observe


def stage_code(code: ThirdPartyCode, folder: Path) -> list[str]:
    """Write the plugin's verified files into the call folder; the host's command."""
    _, files = code.store.read_verified(code.name)  # PluginTampered: nothing runs
    target = folder / PLUGIN_CODE_DIR
    for rel, data in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        path.write_bytes(data)
        path.chmod(0o644)
    for sub in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        sub.chmod(0o755)
    declared = folder / DECLARED_TOOLS
    declared.write_text(json.dumps(code.tools), encoding="utf-8")
    declared.chmod(0o644)
    inside = f"{KERNEL_SOCKET_TARGET}/{PLUGIN_CODE_DIR}"
    return [
        "python3",
        "-I",  # never the project's own `fluffy/` (the working folder is the project)
        "-m",
        "fluffy.sandboxes.plugin_host",
        "--plugin-dir",
        inside,
        "--entry",
        code.entry,
        "--declared",
        f"{KERNEL_SOCKET_TARGET}/{DECLARED_TOOLS}",
    ]


async def await_reply(
    job: Job, sandbox: Sandbox, timeout_s: float, start_timeout_s: float, runtime: ContainerRuntime
) -> dict[str, Any]:
    """The host's answer to ``job``: it connects within ``start_timeout_s`` and answers
    within ``timeout_s``, or the call fails (its container exiting first: SandboxExited)."""
    assert sandbox.container_id is not None
    container_id = sandbox.container_id
    exited = asyncio.ensure_future(
        asyncio.to_thread(runtime.wait, container_id, timeout_s + start_timeout_s)
    )
    try:
        try:
            await asyncio.wait_for(first_done(job.connected.wait(), exited), start_timeout_s)
        except TimeoutError:
            raise ToolTransient(
                f"the {sandbox.template} sandbox for {job.tool} did not connect within "
                f"{start_timeout_s:.0f}s",
                fix="Check `fluffy doctor` and the engine's load.",
            ) from None
        if not job.connected.is_set():
            raise SandboxExited(
                f"the plugin sandbox for {job.tool} exited before asking for work",
                why=output_tail(runtime, container_id),
                fix="Retry the call; if it fails again, look at the sandbox's output in `fluffy "
                "audit log --type sandbox_failed`.",
            )
        try:
            return await asyncio.wait_for(first_done(job.future, exited, value=True), timeout_s)
        except TimeoutError:
            raise ToolTimeout(
                f"{job.tool} did not finish within {timeout_s:g}s",
                fix="Raise tools.call_timeout in policy.yaml, or make the work smaller.",
            ) from None
    finally:
        exited.cancel()
