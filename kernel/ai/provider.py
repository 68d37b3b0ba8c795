"""The kernel's side of the ai-provider sandbox: one sandbox per session turn.

For a turn the kernel makes a private socket folder holding two sockets, mounted
read-only at /run/fluffy in the sandbox:

* ``kernel.sock`` — a server offering only ``ai.next`` / ``ai.event`` / ``ai.result``,
  declared like the kernel's syscalls (typed params, decoded strictly before a handler
  runs; callable on an ai-provider sandbox's own socket only), its binding naming the
  turn: identity comes from the socket, not from the sandbox;
* ``proxy.sock`` — the CONNECT proxy (:mod:`fluffy.kernel.net.proxy`), the sandbox's
  only way out, tagged with the session so every request is audited against it.

The sandbox (template ai-provider: strict seccomp, no network, 256 MiB) runs
``fluffy.sandboxes.ai_host``, which asks for requests until it gets None.  Each model
request of the turn is one job; its stream events come back through ``on_event``.

``launcher="process"`` runs the same host as a plain child process, for tests that ask
for it by name; a kernel never falls back to it (no sandbox: the turn fails closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

from fluffy.errors import (
    ContextTooLong,
    EngineTimeout,
    InvalidPayload,
    ProviderBusy,
    ProviderFailed,
    SandboxConfigError,
    ToolTransient,
)
from fluffy.ipc.ai_types import (
    AIResponse,
    Message,
    ProviderConfig,
    StreamEvent,
    ToolDefinition,
)
from fluffy.ipc.results.sandbox import ModelJob
from fluffy.kernel.ai.kept import KeptByIdentity
from fluffy.kernel.ai.token_estimate import message_tokens
from fluffy.kernel.containers.config import template_config
from fluffy.kernel.containers.lifecycle import Sandbox
from fluffy.kernel.containers.manager import ContainerManager
from fluffy.kernel.containers.runtime import sandbox_identity
from fluffy.kernel.containers.sandboxio import output_tail, socket_dir
from fluffy.kernel.ipc.server import CallContext, KernelServer
from fluffy.kernel.ipc.syscalls import NoParams, OwnSocket, Syscall, SyscallTable
from fluffy.kernel.tools.core.routedcall import TURN_PRIORITY  # as the turn's tool calls
from fluffy.kernel.tools.routing.scheduling import Lease, SchedulerBridge

log = logging.getLogger("fluffy.kernel.ai")

START_TIMEOUT_S = 60.0
EventSink = Callable[[StreamEvent], Awaitable[None]]
#: (socket path, tag, mode, owner) -> a function that stops that socket
ProxyStarter = Callable[
    [Path, str, int, "tuple[int, int] | None"], Awaitable[Callable[[], Awaitable[None]]]
]
#: The ai-provider sandbox of one turn, on its own socket (bindings ``ai:SESSION:TURN``).
AI_SANDBOX = OwnSocket("ai", "the ai-provider sandbox")


class AiEventParams(msgspec.Struct, forbid_unknown_fields=True):
    """``ai.event``: stream events of the current job, in order."""

    job_id: str
    events: list[StreamEvent] = []


class AiResultParams(msgspec.Struct, forbid_unknown_fields=True):
    """``ai.result``: the current job's answer (``fluffy.sandboxes.ai_host.run_request``).

    ``error`` is the adapter's failure as it says it (``what``, ``why``, ``fix``,
    ``kind``, ``retryable``, ``retry_after_s``): :func:`failure` reads it field by field.
    """

    job_id: str
    ok: bool
    response: AIResponse | None = None
    error: dict[str, Any] | None = None
    duration_ms: float | None = None


#: Messages as the request body carries them (plain dicts, where the audit summary's
#: walk finds and masks secret-named fields), converted once: every round sends the whole
#: conversation, as the same objects (:mod:`kernel.ai.kept`).  The dicts are shared
#: between rounds' bodies and never changed.  Bounded by what they hold (~4 characters a
#: token) as well as by count; the system prompt and the tools, made anew each round,
#: are converted each time instead.
_WIRE: KeptByIdentity[Any] = KeptByIdentity(20_000, 8_000_000)


def _wire(message: Message) -> Any:
    if message.role == "system":
        return msgspec.to_builtins(message)
    kept = _WIRE.get(message)
    if kept is not None:
        return kept
    return _WIRE.put(message, msgspec.to_builtins(message), 4 * message_tokens(message))


class _Job(msgspec.Struct):
    job_id: str
    body: dict[str, Any]
    on_event: EventSink
    active_at: float = msgspec.field(default_factory=time.monotonic)  # the last sign of progress
    future: asyncio.Future[AiResultParams] = msgspec.field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ProviderSession:
    """One turn's sandbox: ``request`` as often as the turn needs, then ``close``."""

    def __init__(self, runner: ProviderRunner, binding: str, folder: Path) -> None:
        self.runner = runner
        self.binding = binding
        self.folder = folder
        self.queue: asyncio.Queue[_Job | None] = asyncio.Queue()
        self.current: _Job | None = None
        self.connected = asyncio.Event()
        self.sandbox: Sandbox | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.exited: asyncio.Future[Any] | None = None
        self.stop_proxy: Callable[[], Awaitable[None]] | None = None
        self.server: KernelServer | None = None
        self.closed = False
        self.started_at = time.monotonic()
        self.lease: Lease | None = None  # its scheduler slot (ADR-043)
        #: what the sandbox waited, per round, between sending a response (ai.result)
        #: and getting the next request: the kernel's tool calls and context (seconds)
        self.gaps: list[float] = []
        self._answered_at: float | None = None
        #: the last provider sent and its plain form: a turn's rounds name the same
        #: (frozen) one, and a scripted one carries its whole script (~0.6 ms a round to
        #: convert for a 40-round benchmark's, every round)
        self._provider: tuple[ProviderConfig, dict[str, Any]] | None = None

    # -- the sandbox's methods --------------------------------------------------------
    def methods(self) -> SyscallTable:
        """What this turn's socket serves (to its ai-provider sandbox only)."""
        own = AI_SANDBOX
        return SyscallTable(
            [
                Syscall("ai.next", NoParams, self._next, ModelJob | None, since=1, callers=own),
                Syscall("ai.event", AiEventParams, self._event, None, since=1, callers=own),
                Syscall("ai.result", AiResultParams, self._result, None, since=1, callers=own),
            ]
        )

    async def _next(self, context: CallContext, params: NoParams) -> dict[str, Any] | None:
        self.connected.set()
        job = await self.queue.get()
        self.current = job
        if job is not None and self._answered_at is not None:
            self.gaps.append(time.perf_counter() - self._answered_at)
            self._answered_at = None
        return None if job is None else job.body

    def _job(self, job_id: str) -> _Job:
        job = self.current
        if job is None or job_id != job.job_id:
            raise InvalidPayload("ai.event / ai.result must name the current job (job_id)")
        return job

    async def _event(self, context: CallContext, params: AiEventParams) -> None:
        job = self._job(params.job_id)
        job.active_at = time.monotonic()
        for event in params.events:
            await job.on_event(event)

    async def _result(self, context: CallContext, params: AiResultParams) -> None:
        job = self._job(params.job_id)
        self._answered_at = time.perf_counter()
        if not job.future.done():
            job.future.set_result(params)

    # -- the kernel's side ------------------------------------------------------------
    async def request(
        self,
        provider: ProviderConfig,
        messages: list[Message],
        tools: list[ToolDefinition],
        on_event: EventSink,
        *,
        timeout_s: float | None = None,
    ) -> AIResponse:
        job_id = uuid.uuid4().hex[:12]
        if self._provider is None or self._provider[0] is not provider:
            self._provider = (provider, msgspec.to_builtins(provider))
        body = {
            "job_id": job_id,
            "provider": self._provider[1],
            "messages": [_wire(message) for message in messages],
            "tools": msgspec.to_builtins(tools),
        }
        job = _Job(job_id, body, on_event)
        await self.queue.put(job)
        waits: list[asyncio.Future[Any]] = [job.future]
        if self.exited is not None:
            waits.append(self.exited)
        # a deadline on silence, not on the whole answer: a long stream that keeps
        # sending is fine; a model (or a sandbox) that says nothing for this long is not
        limit = timeout_s if timeout_s is not None else provider.timeout_s + 30
        while True:
            idle = time.monotonic() - job.active_at
            done, _ = await asyncio.wait(
                waits,
                timeout=max(0.05, min(5.0, limit - idle)),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if done or time.monotonic() - job.active_at >= limit:
                break
        if job.future not in done:
            raise ProviderFailed(
                "the AI provider did not answer in time"
                if not done
                else "the ai-provider sandbox stopped during a request",
                why=f"nothing came for {limit:.0f}s" if not done else await self.runner.tail(self),
                fix="Check that the model server is up and allow-listed; then retry.",
            )
        reply = job.future.result()
        if not reply.ok:
            raise failure(reply.error)
        if reply.response is None:
            raise ProviderFailed("the ai-provider sandbox answered ok without a response")
        return reply.response

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.queue.put(None)  # the host exits on None
        await self.runner.teardown(self)


def failure(error: Any) -> ProviderFailed:
    """The sandbox's error of one attempt as the kernel's error: retryable ones as
    :class:`ProviderBusy` (with the provider's wait), a prompt too long as
    :class:`ContextTooLong`, anything else as :class:`ProviderFailed`."""
    error = error if isinstance(error, dict) else {}
    what = str(error.get("what") or "the AI provider's request failed")
    why = str(error.get("why") or "") or None
    fix = str(error.get("fix") or "") or None
    kind = str(error.get("kind") or "other")
    if kind == "context_length":
        return ContextTooLong(what, why=why, fix=fix)
    if error.get("retryable") is True:
        wait = error.get("retry_after_s")
        valid = isinstance(wait, int | float) and not isinstance(wait, bool) and wait >= 0
        return ProviderBusy(
            what, why=why, fix=fix, kind=kind, retry_after_s=float(wait) if valid else None
        )
    return ProviderFailed(what, why=why, fix=fix)


async def _exit_of(manager: ContainerManager, container_id: str) -> int:
    """The container's exit code, once it really exits (an engine wait that times out is
    not an exit: the sandbox may still be answering)."""
    while True:
        try:
            return int(await asyncio.to_thread(manager.runtime.wait, container_id, 60))
        except EngineTimeout:
            continue


class ProviderRunner:
    """Starts a turn's ai-provider sandbox (or child process) with its two sockets."""

    def __init__(
        self,
        root: Path,
        *,
        manager: Callable[[], ContainerManager] | None,
        start_proxy: ProxyStarter,
        launcher: Literal["sandbox", "process"] = "sandbox",
        start_timeout_s: float = START_TIMEOUT_S,
        observer: Callable[[Any], None] | None = None,
    ) -> None:
        self.observer = observer  # every syscall of the sandbox is audited too
        self.root = root
        self._manager = manager
        self.start_proxy = start_proxy
        self.launcher = launcher
        self.start_timeout_s = start_timeout_s
        self.sessions: set[ProviderSession] = set()
        #: the scheduler: a turn's sandbox waits for an ai-provider slot (ADR-043)
        self.slots: SchedulerBridge | None = None

    async def open(self, session_id: str, turn_id: str) -> ProviderSession:
        if self.launcher == "sandbox" and self._manager is None:
            raise SandboxConfigError(
                "the AI adapter has no sandbox to run in",
                why="this kernel was started without a project (--project), so it has no "
                "container manager; the adapter never runs outside its ai-provider sandbox",
                fix="Start the kernel through fluffy (`fluffy` or `fluffy start` in the "
                "project), or `fluffy kernel serve --project DIR`.",
            )
        binding = AI_SANDBOX.binding(session_id, turn_id)
        # the sandbox user, or this process's own uid for a child process (tests)
        uid = sandbox_identity()[0] if self.launcher == "sandbox" else os.geteuid()
        folder, options = socket_dir(self.root, f"ai-{turn_id}", uid)
        session = ProviderSession(self, binding, folder)
        self.sessions.add(session)
        if self.slots is not None:
            try:  # the user waits on this turn: high priority
                session.lease = await self.slots.lease(
                    "ai-provider", f"ai-{turn_id}", priority=TURN_PRIORITY, kind="ai_generate"
                )
            except BaseException:
                await self.teardown(session)
                raise
        server = KernelServer(session.methods())
        session.server = server
        if self.observer is not None:
            server.observer = self.observer
        try:
            await server.listen(folder / "kernel.sock", binding=binding, **options)
            session.stop_proxy = await self.start_proxy(
                folder / "proxy.sock", session_id, options["mode"], options["owner"]
            )
            if self.launcher == "sandbox":
                await self._start_sandbox(session, folder)
            else:
                await self._start_process(session, folder)
            waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(session.connected.wait())]
            assert session.exited is not None
            waits.append(session.exited)
            done, _ = await asyncio.wait(
                waits, timeout=self.start_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            waits[0].cancel()
            if not session.connected.is_set():
                raise ToolTransient(
                    "the ai-provider sandbox did not start"
                    if not done
                    else "the ai-provider sandbox exited before asking for work",
                    why=await self.tail(session),
                    fix="Run `fluffy doctor`; `fluffy images build` rebuilds the images.",
                )
        except BaseException:
            await self.teardown(session)
            raise
        return session

    async def _start_sandbox(self, session: ProviderSession, folder: Path) -> None:
        assert self._manager is not None
        config = template_config(
            "ai-provider", plugin_name="ai-provider", kernel_socket_dir=folder, project_dir=None
        )
        manager = await asyncio.to_thread(self._manager)
        command = ["python3", "-I", "-m", "fluffy.sandboxes.ai_host"]
        sandbox = await asyncio.to_thread(manager.create, config, command)
        session.sandbox = sandbox
        assert sandbox.container_id is not None
        session.exited = asyncio.ensure_future(_exit_of(manager, sandbox.container_id))

    async def _start_process(self, session: ProviderSession, folder: Path) -> None:
        session.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "fluffy.sandboxes.ai_host",
            "--socket",
            str(folder / "kernel.sock"),
            "--proxy",
            str(folder / "proxy.sock"),
            "--no-tighten",
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder)},
        )
        session.exited = asyncio.ensure_future(session.process.wait())

    async def tail(self, session: ProviderSession) -> str:
        try:
            if session.process is not None and session.process.stderr is not None:
                if session.process.returncode is None:
                    return "it is still running"
                data = await asyncio.wait_for(session.process.stderr.read(), 2)
                return data.decode(errors="replace")[-800:] or "no output"
            if session.sandbox is not None and self._manager is not None:
                manager = await asyncio.to_thread(self._manager)
                cid = str(session.sandbox.container_id)
                return await asyncio.to_thread(output_tail, manager.runtime, cid, 800)
        except Exception as exc:
            return f"its output is unavailable ({type(exc).__name__})"
        return "no output"

    async def teardown(self, session: ProviderSession) -> None:
        self.sessions.discard(session)
        try:
            await self._stop(session)
        finally:
            if session.lease is not None:  # the slot is free once the sandbox is gone
                session.lease.release()
                session.lease = None

    async def _stop(self, session: ProviderSession) -> None:
        if session.process is not None and session.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                try:
                    await asyncio.wait_for(session.process.wait(), 5)
                except TimeoutError:
                    session.process.kill()
                    await session.process.wait()
        if session.sandbox is not None and self._manager is not None:
            manager = await asyncio.to_thread(self._manager)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(manager.destroy, session.sandbox)
        if session.exited is not None:
            session.exited.cancel()
        if session.stop_proxy is not None:
            with contextlib.suppress(Exception):
                await session.stop_proxy()
        if session.server is not None:
            with contextlib.suppress(Exception):
                await session.server.close()
        shutil.rmtree(session.folder, ignore_errors=True)

    async def close(self) -> None:
        for session in list(self.sessions):
            with contextlib.suppress(Exception):
                await session.close()
