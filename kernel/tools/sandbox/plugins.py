"""Running a tool plugin's call in a fresh L2 sandbox (built-in or third-party).

One call, one sandbox (design: a new output volume per sandbox, never reused), maybe
made before the call by the warm pool (:mod:`.pool`, ADR-038; its image is confirmed
while the call runs, ADR-095): steps 1-2 and the host's start-up then happened ahead:

1. a private socket folder and a kernel server on it whose binding names the sandbox,
   which serves one call (identity comes from the socket, never from the plugin);
2. the sandbox of the plugin's template: project read-only at /workspace, the session's
   staged changes read-only at /staged, its own ``/output`` tmpfs (sized, noexec), its
   own socket, an empty environment (:mod:`fluffy.kernel.tools.sandbox.envfilter`);
3. the in-sandbox host (``fluffy.sandboxes.plugin_host``) connects and asks for work
   (``tool.next``); it gets this call, sends the files it wrote (``tool.files``, into
   the kernel's own call folder: :mod:`fluffy.kernel.tools.sandbox.callfiles`), answers with
   ``tool.result``, asks again, gets ``None`` and exits;
4. the caller reads the call folder (ingest / merge), then :meth:`PluginRunner.release`
   destroys the sandbox in the background.

PAUSE/RESUME (design: Preemption) reach the host as ``tool.pause`` / ``tool.resume``
events on its connection, around an engine pause.

A third-party plugin's code is not in the image: its installed files are read from the
plugin store, each checked against the hash recorded at install, and written into the
call's own socket folder (``/run/fluffy/plugin``, read-only in the sandbox) with the
manifest's tool definitions (``/run/fluffy/tools.json``); the host loads the entry file
from there and refuses code whose tools differ from the manifest.  Copying the verified
bytes (rather than mounting the store) leaves no window between check and use, and needs
no extra mount.

A plugin's socket (:mod:`.pluginsocket`) serves ``tool.next``, ``tool.files`` and
``tool.result`` only.  Anything else a plugin calls on it is denied (``policy.*``) and
audited as a ``syscall`` entry naming the plugin, whether or not the method is among its
declared capabilities.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from fluffy.errors import (
    FluffyError,
    KernelOverloaded,
    SandboxExited,
    ToolFailed,
    ToolTimeout,
    ToolTransient,
)
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.containers.config import template_config
from fluffy.kernel.containers.lifecycle import FailureReason, Sandbox
from fluffy.kernel.containers.manager import ContainerManager
from fluffy.kernel.containers.sandboxio import socket_dir
from fluffy.kernel.ipc.server import KernelServer, Limits
from fluffy.kernel.tools.core.capabilities import Capabilities, Scope
from fluffy.kernel.tools.sandbox.pluginjob import (
    CallRequest,
    Job,
    NeverTaken,
    PluginOutcome,
    ThirdPartyCode,
    connection_key,
    open_call_dir,
    plugin_error,
)
from fluffy.kernel.tools.sandbox.pluginsocket import (
    PLUGIN_SANDBOX,
    PluginSocket,
    await_reply,
    stage_code,
)
from fluffy.kernel.tools.sandbox.pool import Recipe, SandboxPool, Slot, folder_identity

log = logging.getLogger("fluffy.kernel.tools")

#: A plugin host has this long to start and ask for its call.
START_TIMEOUT_S = 60.0
#: A plugin's socket: few connections, few requests in flight each (frames are 4 MiB).
PLUGIN_SOCKET_LIMITS = Limits(max_connections=16, max_in_flight=4)
PAUSE_GRACE_S = 1.0


class PluginRunner:
    """Starts plugin sandboxes and serves their sockets (on the kernel's loop)."""

    def __init__(
        self,
        manager: Callable[[], ContainerManager],
        root: Path,
        *,
        environment: Callable[[], dict[str, str]],
        start_timeout_s: float = START_TIMEOUT_S,
        audit: AuditLog | None = None,
    ) -> None:
        self._manager = manager
        self.root = root
        self.environment = environment
        self.start_timeout_s = start_timeout_s
        self.audit = audit
        self.jobs: dict[str, Job] = {}
        self.servers: dict[str, KernelServer] = {}
        self._cleanup: set[asyncio.Task[None]] = set()
        #: What the plugins' sockets serve (the host's side of each call).
        self.socket = PluginSocket(self.jobs, audit)
        #: Warm sandboxes (None: every call makes its own).
        self.pool: SandboxPool | None = None

    @property
    def third_party(self) -> dict[str, ThirdPartyCode]:
        """Active third-party plugins by name (set by the kernel at start-up)."""
        return self.socket.third_party

    @third_party.setter
    def third_party(self, code: dict[str, ThirdPartyCode]) -> None:
        self.socket.third_party = code

    @property
    def capabilities(self) -> Capabilities | None:
        """Issues the capability tokens of calls that write (None: no tokens)."""
        return self.socket.capabilities

    @capabilities.setter
    def capabilities(self, capabilities: Capabilities | None) -> None:
        self.socket.capabilities = capabilities

    def manager(self) -> ContainerManager:
        """The container manager (opened on first use: call it off the event loop)."""
        return self._manager()

    # -- making a sandbox ----------------------------------------------------------------
    def recipe(
        self,
        *,
        plugin: str,
        module: str,
        template: str,
        project: Path,
        staged_dir: Path | None,
        timeout_s: float,
        image: str | None = None,
    ) -> Recipe:
        """What a sandbox for this call is made of (the pool's key)."""
        return Recipe(
            plugin=plugin,
            module=module,
            template=template,
            project=project,
            staged_dir=staged_dir,
            image=image,
            max_duration=f"{int(timeout_s + self.start_timeout_s) + 5}s",
            environment=tuple(sorted(self.environment().items())),
            third_party=plugin in self.third_party,
            identity=folder_identity(project, staged_dir),
        )

    async def open_slot(self, recipe: Recipe, *, pooled: bool = True, call_id: str = "") -> Slot:
        """Create and start a sandbox of ``recipe`` whose host will wait for one call.

        ``pooled``: also read the image id its container was made from (the pool checks
        it against the reference's current one while the sandbox's call runs)."""
        plugin = recipe.plugin
        slot_id = uuid.uuid4().hex[:12]
        binding = PLUGIN_SANDBOX.binding(plugin, slot_id)
        folder, options = socket_dir(self.root, f"tool-{slot_id}")
        server = KernelServer(self.socket.methods(plugin), limits=PLUGIN_SOCKET_LIMITS)
        server.observer = self.socket.observer()
        code = self.third_party.get(plugin)
        job = Job(
            "",
            "",
            {},
            "",
            min_api_version=code.min_api_version if code is not None else 0,
            plugin=plugin,
            slot=slot_id,
            pooled=pooled,
        )
        self.jobs[binding] = job
        self.servers[binding] = server
        sandbox: Sandbox | None = None
        try:
            command = ["python3", "-I", "-m", "fluffy.sandboxes.plugin_host", recipe.module]
            if code is not None:
                command = await asyncio.to_thread(stage_code, code, folder)
            await server.listen(folder / "kernel.sock", binding=binding, **options)
            config = template_config(
                recipe.template,
                plugin_name=plugin,
                project_dir=recipe.project,
                kernel_socket_dir=folder,
                staged_dir=recipe.staged_dir,
                environment=dict(recipe.environment),
                max_duration=recipe.max_duration,
                image=recipe.image,
            )
            manager = await asyncio.to_thread(self.manager)
            making = asyncio.ensure_future(
                asyncio.to_thread(manager.create, config, command, call_id=call_id)
            )
            try:
                sandbox = await asyncio.shield(making)
            except asyncio.CancelledError:  # the engine goes on making it: destroy it then
                making.add_done_callback(self._destroy_late)
                raise
            job.sandbox_id = sandbox.sandbox_id
            job.sandbox = sandbox
            ref = recipe.image or manager.images.get(recipe.template, "")
            image_id = ""
            if pooled:
                container_id = sandbox.container_id or ""
                state = await asyncio.to_thread(manager.runtime.inspect, container_id)
                image_id = state.image_id
        except BaseException:
            await self._teardown(binding, sandbox)
            raise
        return Slot(recipe, binding, job, sandbox, ref, image_id)

    def _destroy_late(self, making: asyncio.Future[Sandbox]) -> None:
        """A sandbox whose making was given up, once it is made: destroyed."""
        if making.cancelled() or making.exception() is not None:
            return
        sandbox = making.result()

        def destroy() -> None:
            self.manager().destroy(sandbox)

        self._background(asyncio.to_thread(destroy))

    async def close_slot(self, slot: Slot) -> None:
        await self._teardown(slot.binding, slot.sandbox)

    async def image_id(self, ref: str) -> str:
        """The id of the image ``ref`` names now (the engine's answer)."""
        return await asyncio.to_thread(lambda: self.manager().runtime.image_id(ref))

    # -- running a call -----------------------------------------------------------------
    async def run(
        self,
        *,
        plugin: str,
        module: str,
        template: str,
        call_id: str,
        tool: str,
        args: dict[str, Any],
        session_mode: str,
        project: Path,
        staged_dir: Path | None,
        timeout_s: float,
        image: str | None = None,
        settings: dict[str, Any] | None = None,
        capability: Scope | None = None,
    ) -> PluginOutcome:
        """Run one call; the sandbox stays until :meth:`release` (its output is needed).

        ``image``: a fluffy image other than the template's (a project's test
        environment); ``settings``: the kernel's settings the call's job carries;
        ``capability``: what the call's token covers (a write: its paths)."""
        started = time.perf_counter()
        recipe = self.recipe(
            plugin=plugin,
            module=module,
            template=template,
            project=project,
            staged_dir=staged_dir,
            timeout_s=timeout_s,
            image=image,
        )
        call = CallRequest(
            call_id, tool, dict(args), session_mode, dict(settings or {}), timeout_s, capability
        )
        slot = await self.pool.take(recipe) if self.pool is not None else None
        if slot is not None:
            try:
                outcome = await self._warm_call(slot, call, started)
            except NeverTaken as exc:
                log.warning("a pooled %s sandbox failed before its call: %s", template, exc)
            else:
                if outcome is not None:
                    return outcome
        slot = await self.open_slot(recipe, pooled=False, call_id=call_id)
        return await self._call(slot, call, started, warm=False)

    async def _warm_call(
        self, slot: Slot, call: CallRequest, started: float
    ) -> PluginOutcome | None:
        """``call`` in a pooled sandbox while the pool confirms, meanwhile, that its image
        is still current (an engine round trip kept off the call's path, ADR-095).  None:
        it was not; the call is stopped, its sandbox destroyed and nothing it did used."""
        assert self.pool is not None
        running = asyncio.create_task(self._call(slot, call, started, warm=True))
        current = False
        try:
            current = await self.pool.confirm(slot)
        finally:
            if not current:  # a stale image, or this call was cancelled meanwhile
                self._drop(slot, running, call.call_id)
        return await running if current else None

    def _drop(self, slot: Slot, running: asyncio.Task[PluginOutcome], call_id: str) -> None:
        """Stop a stale sandbox's call, its sandbox destroyed in the background; nothing
        it did is used.  Its job no longer answers to the call's id (the call runs again
        in another sandbox, which the scheduler's pause and kill must find)."""
        job = slot.job
        assert isinstance(job, Job)
        job.call_id = f"{call_id} (stale)"
        if not job.future.done():  # stopped where it waits for the reply: it tears down
            running.cancel()

        def finished(task: asyncio.Task[PluginOutcome]) -> None:
            if task.cancelled():
                if slot.binding in self.jobs:  # stopped before it began
                    self._background(self._teardown(slot.binding, slot.sandbox))
            elif task.exception() is None:  # it answered first
                self._background(self.release(task.result()))

        running.add_done_callback(finished)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._cleanup.add(task)
        task.add_done_callback(self._cleanup.discard)

    async def _call(
        self, slot: Slot, call: CallRequest, started: float, *, warm: bool
    ) -> PluginOutcome:
        """Hand ``call`` to the sandbox of ``slot`` and wait for its answer."""
        job = slot.job
        assert isinstance(job, Job)
        binding, sandbox = slot.binding, slot.sandbox
        job.call_id, job.tool, job.args = call.call_id, call.tool, call.args
        job.session_mode, job.settings = call.session_mode, call.settings
        job.capability, job.timeout_s = call.capability, call.timeout_s
        sandbox.call_id = call.call_id  # its destroyed entry names the call it served
        job.placed.set()
        created = time.perf_counter()
        manager = self.manager()  # opened already: it made this sandbox
        try:
            reply = await await_reply(
                job, sandbox, call.timeout_s, self.start_timeout_s, manager.runtime
            )
            done = time.perf_counter()
        except BaseException as exc:
            failure = _failure_of(exc)
            if failure is not None:
                manager.mark_failed(sandbox, failure, str(getattr(exc, "what", exc)))
            await self._teardown(binding, sandbox)
            never_taken = not job.handed and not job.future.done()  # not killed: it died
            if warm and never_taken and isinstance(exc, ToolTransient):
                raise NeverTaken(exc.what) from exc
            raise
        timings = {
            "create_ms": (created - started) * 1000,
            "ready_ms": (job.handed_at - started) * 1000,
            "exchange_ms": (done - job.handed_at) * 1000,
            "total_ms": (done - started) * 1000,
            # the tool's own run time, as the plugin host measured it
            "tool_ms": float(reply.get("duration_ms") or 0.0),
            "warm": 1.0 if warm else 0.0,
        }
        plugin, tool = job.plugin, job.tool
        if not reply.get("ok"):
            raw_error = reply.get("error")
            error: dict[str, Any] = raw_error if isinstance(raw_error, dict) else {}
            await self._teardown(binding, sandbox)
            raise plugin_error(plugin, tool, error)
        result = reply.get("result")
        if not isinstance(result, dict):
            await self._teardown(binding, sandbox)
            raise ToolFailed(
                f"{plugin} answered {tool} without a result object",
                why="a plugin answers a call with a JSON object",
                fix="The plugin is broken for this tool; report it to its author, or disable it "
                "(`fluffy plugin disable`).",
            )
        try:
            fd = await asyncio.to_thread(open_call_dir, sandbox.output_dir, call.call_id)
        except ToolFailed:
            await self._teardown(binding, sandbox)
            raise
        connection = connection_key(job.context) if job.context is not None else None
        return PluginOutcome(
            result, Path(f"/proc/self/fd/{fd}"), sandbox, timings, fd, job.token, connection
        )

    async def release(self, outcome: PluginOutcome) -> None:
        """Destroy the call's sandbox (and its output folder) in the background."""
        outcome.close()
        binding = next(
            (b for b, j in self.jobs.items() if j.sandbox_id == outcome.sandbox.sandbox_id), None
        )
        self._background(self._teardown(binding, outcome.sandbox))

    async def _teardown(self, binding: str | None, sandbox: Sandbox | None) -> None:
        # the call is over: its token ends now, before the (slow) engine work, so no
        # late use is honoured and its end is in the log whatever the engine does; the
        # job stays listed until then (a teardown cancelled meanwhile leaves it to close)
        job = self.jobs.get(binding) if binding is not None else None
        if job is not None and job.token is not None and self.capabilities is not None:
            self.capabilities.expire(job.token.token_id, job.call_id)
            job.token = None
        if sandbox is not None:
            with contextlib.suppress(FluffyError, OSError):
                await asyncio.to_thread(lambda: self.manager().destroy(sandbox))
        if binding is None:
            return
        job = self.jobs.pop(binding, None)
        server = self.servers.pop(binding, None)
        if server is not None:
            await server.close()
        if job is not None:
            shutil.rmtree(self.root / "ipc" / f"tool-{job.slot}", ignore_errors=True)

    # -- preemption (design: PAUSE_SIGNAL, 1 s grace, engine pause) ---------------------
    def _job_for(self, sandbox_id: str) -> Job | None:
        return next((j for j in self.jobs.values() if j.sandbox_id == sandbox_id), None)

    async def pause(self, sandbox: Sandbox) -> None:
        job = self._job_for(sandbox.sandbox_id)
        if job is not None and job.context is not None:
            with contextlib.suppress(Exception):
                job.context.send_event("tool.pause", {"call_id": job.call_id})
            await asyncio.sleep(PAUSE_GRACE_S)
        assert sandbox.container_id is not None
        container_id = sandbox.container_id
        await asyncio.to_thread(lambda: self.manager().runtime.pause(container_id))

    async def resume(self, sandbox: Sandbox) -> None:
        assert sandbox.container_id is not None
        container_id = sandbox.container_id
        await asyncio.to_thread(lambda: self.manager().runtime.resume(container_id))
        job = self._job_for(sandbox.sandbox_id)
        if job is not None and job.context is not None:
            with contextlib.suppress(Exception):
                job.context.send_event("tool.resume", {"call_id": job.call_id})

    def _job_by_call(self, call_id: str) -> Job | None:
        return next((j for j in self.jobs.values() if j.call_id == call_id), None)

    async def pause_call(self, call_id: str) -> None:
        job = self._job_by_call(call_id)
        if job is not None and job.sandbox is not None:
            await self.pause(job.sandbox)

    async def resume_call(self, call_id: str) -> None:
        job = self._job_by_call(call_id)
        if job is not None and job.sandbox is not None:
            await self.resume(job.sandbox)

    async def destroy_call(self, call_id: str, reason: FluffyError) -> None:
        job = self._job_by_call(call_id)
        if job is None:
            return
        if not job.future.done():
            job.future.set_exception(reason)
        if job.sandbox is not None:
            sandbox = job.sandbox
            with contextlib.suppress(FluffyError, OSError):
                await asyncio.to_thread(lambda: self.manager().destroy(sandbox))

    def evict(self) -> int:
        """Kernel memory at 90 %: destroy the running plugin sandboxes (non-critical) and
        the pool's idle ones."""
        count = self.pool.drain() if self.pool is not None else 0
        for job in list(self.jobs.values()):
            idle = job.pooled and not job.placed.is_set()  # the pool's: drained above
            if not idle and not job.future.done():
                job.future.set_exception(
                    KernelOverloaded(
                        f"{job.tool} was stopped: the kernel is short of memory",
                        fix="Call it again when the kernel has recovered.",
                    )
                )
                count += 1
        return count

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        for binding in list(self.jobs):
            job = self.jobs[binding]
            if not job.future.done():
                job.future.set_exception(ToolTransient("the kernel is shutting down"))
            await self._teardown(binding, None)
        if self._cleanup:
            await asyncio.gather(*self._cleanup, return_exceptions=True)


def _failure_of(exc: BaseException) -> FailureReason | None:
    """The lifecycle failure a call's error stands for (None: not the sandbox's)."""
    if isinstance(exc, ToolTimeout):
        return FailureReason.TIMEOUT
    return FailureReason.CRASH if isinstance(exc, SandboxExited) else None
