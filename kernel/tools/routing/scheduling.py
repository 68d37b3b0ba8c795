"""Everything that runs a sandbox goes through the scheduler (design: Scheduler Module;
ADR-043).

* A plugin call (:meth:`SchedulerBridge.schedule`) is a task of its template: the
  concurrency limits hold (global 4; code-executor 2, ...), better priorities go first,
  and a busy template can preempt: PAUSE sends ``tool.pause`` to the plugin host, waits
  the 1 s grace and pauses the container through the engine; RESUME undoes it and sends
  ``tool.resume``; DESTROY removes the sandbox and fails the call.
* A long-lived sandbox holds a *lease* (:meth:`SchedulerBridge.lease`): a task that runs
  while the sandbox lives.  The ai-provider sandbox of a turn waits for its lease like
  any task; the warm pool's sandboxes hold *yielding* leases (never in a better
  priority's way); the policy sandbox *reserves* its slot (:meth:`SchedulerBridge.
  reserve`), never queued.  Leases are never paused: nothing in them can be frozen
  safely mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fluffy.errors import (
    DependencyFailed,
    FluffyError,
    SchedulerError,
    TaskCancelled,
    ToolFailed,
)
from fluffy.kernel.policy.tool_settings import SchedulerSettings
from fluffy.kernel.scheduler.scheduler import Scheduler
from fluffy.kernel.scheduler.task import (
    NO_SANDBOX,
    PRIORITY_NORMAL,
    PRIORITY_SYSTEM,
    Limits,
    Task,
    TaskHandle,
    TaskType,
)
from fluffy.kernel.tools.routing.parallel import PlannedCall, dependencies
from fluffy.kernel.tools.sandbox.plugins import PluginRunner

log = logging.getLogger("fluffy.kernel.scheduler")

#: A lease outlives any one call; the sandbox's own max_duration bounds it.
LEASE_MAX_DURATION_S = 7 * 24 * 3600.0


class _Preemptor:
    def __init__(self, runner: PluginRunner) -> None:
        self.runner = runner

    @staticmethod
    def _call_only(task: Task[Any], action: str) -> None:
        if task.type != "tool_call":
            raise SchedulerError(
                f"{task.id} ({task.type}) cannot be {action}: it is a lease",
                why="only tool calls can be paused or resumed; a lease only holds a sandbox slot",
                fix="Pause or resume the tool call itself.",
            )

    async def pause(self, task: Task[Any]) -> None:
        self._call_only(task, "paused")
        await self.runner.pause_call(task.id)

    async def resume(self, task: Task[Any]) -> None:
        await self.runner.resume_call(task.id)

    async def destroy(self, task: Task[Any]) -> None:
        self._call_only(task, "destroyed")
        await self.runner.destroy_call(task.id, TaskCancelled(f"{task.id} was preempted"))


class Lease:
    """A slot held for a long-lived sandbox until :meth:`release`."""

    def __init__(self, scheduler: Scheduler, key: str) -> None:
        self.scheduler = scheduler
        self.key = key
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._released = asyncio.Event()
        #: called (once) if the scheduler ends the lease before it was released
        self.on_lost: Callable[[], None] | None = None

    async def hold(self, handle: TaskHandle) -> None:
        if not self.started.done():
            self.started.set_result(None)
        try:
            await self._released.wait()
        except asyncio.CancelledError:
            if not self._released.is_set() and self.on_lost is not None:
                self.on_lost()
            raise

    def release(self) -> None:
        """Give the slot back (idempotent); a lease still queued is cancelled."""
        if self._released.is_set():
            return
        self._released.set()
        with contextlib.suppress(SchedulerError):
            if self.scheduler.get(self.key).state in ("queued", "waiting_dependency"):
                self.scheduler.cancel(self.key)
        task = asyncio.ensure_future(self._forget())
        _KEEP.add(task)
        task.add_done_callback(_KEEP.discard)

    async def _forget(self) -> None:
        with contextlib.suppress(Exception):
            await self.scheduler.result(self.key)
        self.scheduler.forget(self.key)


_KEEP: set[asyncio.Future[Any]] = set()


class SchedulerBridge:
    def __init__(
        self,
        settings: SchedulerSettings,
        runner: PluginRunner | None,
        accepting_work: Callable[[], bool],
        memory_usage: Callable[[], float] = lambda: 0.0,
        max_duration_s: float = 3600.0,
    ) -> None:
        self.max_duration_s = max_duration_s
        #: Called when a scheduled call has ended and given its slot back (the warm pool
        #: refills then, not at its next tick: the model's next call may come before).
        self.on_finish: list[Callable[[], None]] = []
        self.scheduler = Scheduler(
            Limits(global_max=settings.global_max, per_template=settings.limits),
            memory_usage=memory_usage,
            preemptor=_Preemptor(runner) if runner is not None else None,
            age_threshold_s=settings.age_threshold_s,
            accepting_work=accepting_work,
        )

    async def start(self) -> None:
        await self.scheduler.start()

    async def close(self) -> None:
        await self.scheduler.close()

    async def schedule(
        self,
        template: str,
        key: str,
        work: Callable[[], Awaitable[Any]],
        priority: int = PRIORITY_NORMAL,
        *,
        kind: TaskType = "tool_call",
    ) -> Any:
        async def run(handle: TaskHandle) -> Any:
            return await work()

        task: Task[Any] = Task(
            id=key,
            type=kind,
            sandbox_template=template,
            run=run,
            priority=priority,
            max_duration_s=self.max_duration_s,
        )
        self.scheduler.submit(task)
        try:
            return await self.scheduler.result(key)
        finally:
            self.scheduler.forget(key)
            self._hooks(self.on_finish)

    async def lease(
        self, template: str, key: str, *, priority: int, kind: TaskType, yields: bool = False
    ) -> Lease:
        """Wait for a slot of ``template`` and hold it until the lease is released."""
        lease, task = self._lease_task(template, key, priority, kind, yields)
        self.scheduler.submit(task)
        ended = asyncio.ensure_future(self.scheduler.result(key))
        try:
            await asyncio.wait({lease.started, ended}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            lease.release()
            raise
        finally:
            if not ended.done():
                ended.cancel()
        if not lease.started.done():  # ended before it ever ran (cancelled, closed)
            lease.release()
            await ended  # raises why
            raise SchedulerError(
                f"lease {key} ended before it started",
                why="the lease's task ended (cancelled or failed) before it got its slot",
                fix="Retry the call; the scheduler's state is in `fluffy status --json`.",
            )
        return lease

    def _lease_task(
        self, template: str, key: str, priority: int, kind: TaskType, yields: bool = False
    ) -> tuple[Lease, Task[None]]:
        """A lease and the task that holds its slot until it is released."""
        lease = Lease(self.scheduler, key)
        task: Task[None] = Task(
            id=key,
            type=kind,
            sandbox_template=template,
            run=lease.hold,
            priority=priority,
            max_duration_s=LEASE_MAX_DURATION_S,
            yields=yields,
        )
        return lease, task

    @staticmethod
    def _hooks(hooks: list[Callable[[], None]]) -> None:
        for hook in hooks:
            try:
                hook()
            except Exception:
                log.exception("a scheduler hook failed")

    def reserve(
        self, template: str, key: str, *, kind: TaskType, priority: int = PRIORITY_SYSTEM
    ) -> Lease:
        """A slot of ``template`` at once, counted, never queued (the policy sandbox).
        Call on the scheduler's event loop."""
        lease, task = self._lease_task(template, key, priority, kind)
        self.scheduler.reserve(task)
        return lease

    def reserver(self, template: str, kind: TaskType) -> Callable[[], Callable[[], None]]:
        """:meth:`reserve` for code on other threads (the policy sandbox starts in one):
        the returned function reserves a slot and returns the function that frees it."""
        loop = asyncio.get_running_loop()

        async def take() -> Lease:
            return self.reserve(template, f"{template}-{uuid.uuid4().hex[:12]}", kind=kind)

        def reserve() -> Callable[[], None]:
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is loop:
                lease = self.reserve(template, f"{template}-{uuid.uuid4().hex[:12]}", kind=kind)
            else:
                lease = asyncio.run_coroutine_threadsafe(take(), loop).result(30)

            def release() -> None:
                if not loop.is_closed():
                    loop.call_soon_threadsafe(lease.release)

            return release

        return reserve

    def free(self, template: str) -> int:
        """Slots of ``template`` nothing holds now but yielding leases, and nothing
        queued waits for (what background work may take without delaying anyone)."""
        stats = self.scheduler.stats()
        if stats.by_state.get("queued", 0) or stats.by_state.get("paused", 0):
            return 0
        limits = self.scheduler.limits
        running = stats.running_by_template
        busy = sum(running.values())
        return max(
            0,
            min(
                limits.for_template(template) - running.get(template, 0),
                limits.global_max - busy,
            ),
        )

    def figures(self) -> dict[str, Any]:
        """What kernel.ping and tool.status show of the scheduler."""
        return {**self.scheduler.stats().as_dict(), "limits": self.scheduler.limits.as_dict()}


#: A batch's steps (one per call) take no slot; each call has its own time limit.
STEP_MAX_DURATION_S = 24 * 3600.0
#: Kinds of call whose failure fails the calls that depend on them: they change what a
#: later call sees.  A failed read fails nothing (a write after a read of a missing file
#: is the usual way to create it); the read still runs before the write.
CHANGING_KINDS = frozenset({"write", "execute", "commit", "workflow"})


async def run_ordered(
    scheduler: Scheduler | None,
    calls: Sequence[PlannedCall],
    tools: Sequence[str],
    changes: Sequence[bool],
    run: Callable[[int], Awaitable[dict[str, Any]]],
    refuse: Callable[[int, FluffyError], Awaitable[dict[str, Any]]],
    *,
    priority: int,
) -> list[dict[str, Any]]:
    """Run one response's calls as scheduler tasks with their dependencies (ADR-043).

    Call ``i`` depends on every earlier call it conflicts with (kernel.tools.routing.parallel:
    paths read and written), so the scheduler starts it only once they completed; calls
    without conflicts run at once, side by side.  When a call that changes something
    fails, the calls depending on it are not run: ``refuse(i, DependencyFailed)`` gives
    their answer.  ``scheduler`` None: a private one for this batch."""
    own = scheduler is None
    sched = scheduler if scheduler is not None else Scheduler(Limits())
    if own:
        await sched.start()
    batch = uuid.uuid4().hex[:8]
    ids = [f"{tools[c.index]}#{c.index}@{batch}" for c in calls]
    answers: list[dict[str, Any]] = [{} for _ in calls]

    def step(i: int) -> Callable[[TaskHandle], Awaitable[None]]:
        async def go(handle: TaskHandle) -> None:
            answer = answers[i] = await run(i)
            if changes[i] and not answer.get("ok"):
                error = answer.get("error") or {}
                raise ToolFailed(
                    f"{tools[i]} (call {i} of the response) failed",
                    why=str(error.get("what") or "") or None,
                    fix="Read the call's own error in the answer; retry that call alone.",
                )

        return go

    try:
        for i, before in enumerate(dependencies(calls)):
            deps = tuple(ids[j] for j in before)
            sched.submit(
                Task(
                    ids[i],
                    "step",
                    NO_SANDBOX,
                    step(i),
                    priority=priority,
                    dependencies=deps,
                    max_duration_s=STEP_MAX_DURATION_S,
                )
            )
        for i, task_id in enumerate(ids):
            try:
                await sched.result(task_id)
            except DependencyFailed as exc:
                answers[i] = await refuse(i, exc)
            except ToolFailed:
                pass  # its own answer stands
            except FluffyError as exc:
                if not answers[i]:
                    answers[i] = await refuse(i, exc)
    finally:
        for task_id in ids:  # a cancelled turn: nothing of it goes on running
            with contextlib.suppress(SchedulerError):
                if sched.get(task_id).state not in ("completed", "failed", "cancelled"):
                    sched.cancel(task_id)
        if own:
            await sched.close()
        else:
            for task_id in reversed(ids):  # dependents first: forget needs that
                sched.forget(task_id)
    return answers


async def run_in_turn(
    count: int,
    run: Callable[[int], Awaitable[dict[str, Any]]],
    refuse: Callable[[int, FluffyError], Awaitable[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """A response's calls one after the other, in its order (ADR-100): for reads the
    kernel answers on the loop's own thread, which side by side would only take turns
    on it, and as scheduler tasks cost ~0.1 ms each more.  Nothing depends on a read, so
    each answers for itself (an error escaping a call answers as run_ordered's does)."""
    answers: list[dict[str, Any]] = []
    for i in range(count):
        try:
            answers.append(await run(i))
        except FluffyError as exc:
            answers.append(await refuse(i, exc))
    return answers
