"""Plugin calls go through the scheduler (design: Scheduler Module).

Every call that needs a sandbox becomes a task of its template, so the concurrency
limits hold (global 4; code-executor 2, ...), higher priorities go first, and a busy
template can preempt: PAUSE sends ``tool.pause`` to the plugin host, waits the 1 s
grace and pauses the container through the engine; RESUME undoes it and sends
``tool.resume``; DESTROY removes the sandbox and fails the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fluffy.errors import TaskCancelled
from fluffy.kernel.scheduler.scheduler import Scheduler
from fluffy.kernel.scheduler.task import PRIORITY_NORMAL, Limits, Task, TaskHandle
from fluffy.kernel.tools.plugins import PluginRunner
from fluffy.kernel.tools.settings import SchedulerSettings


class _Preemptor:
    def __init__(self, runner: PluginRunner) -> None:
        self.runner = runner

    async def pause(self, task: Task[Any]) -> None:
        await self.runner.pause_call(task.id)

    async def resume(self, task: Task[Any]) -> None:
        await self.runner.resume_call(task.id)

    async def destroy(self, task: Task[Any]) -> None:
        await self.runner.destroy_call(task.id, TaskCancelled(f"{task.id} was preempted"))


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
        self.scheduler = Scheduler(
            Limits(global_max=settings.global_max, per_template=dict(settings.per_template)),
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
        *,
        priority: int = PRIORITY_NORMAL,
        kind: str = "tool_call",
    ) -> Any:
        async def run(handle: TaskHandle) -> Any:
            return await work()

        task: Task[Any] = Task(
            id=key,
            type=kind,  # type: ignore[arg-type]
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
