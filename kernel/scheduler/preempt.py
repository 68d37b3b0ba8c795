"""Preemption (design: Scheduler Module, Preemption Strategy), as pure decisions.

When a task that is strictly higher in effective priority is ready but its template or
the global limit is full, the scheduler picks one running victim with
:func:`pick_victim` and acts on :func:`decide`::

    if victim.elapsed > victim.max_duration * 0.8:  WAIT     (almost done, let it finish)
    elif system memory usage > 0.8:                 DESTROY  (release resources)
    else:                                           PAUSE    (engine pause, cgroup freezer)

The acting is the kernel's :class:`Preemptor` (PAUSE_SIGNAL over IPC, the 1 s grace,
then the engine's pause; RESUME_SIGNAL on resume).  Without a preemptor the scheduler
never preempts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Literal, Protocol, runtime_checkable

import msgspec

from fluffy.kernel.scheduler.task import Task

Decision = Literal["wait", "destroy", "pause"]

WAIT_FRACTION: Final = 0.8  # of the victim's max_duration
DESTROY_MEMORY: Final = 0.8  # fraction of the memory limit in use


def decide(victim_elapsed_s: float, victim_max_duration_s: float, memory_usage: float) -> Decision:
    """The design's rule; both thresholds are strict (exactly 80 % pauses)."""
    if victim_elapsed_s > victim_max_duration_s * WAIT_FRACTION:
        return "wait"
    if memory_usage > DESTROY_MEMORY:
        return "destroy"
    return "pause"


class RunningTask(msgspec.Struct, frozen=True):
    """What victim selection needs to know of a running task."""

    task_id: str
    template: str
    priority: int  # the effective priority it was dispatched with
    start_seq: int  # order of first start; higher = newer


def pick_victim(
    running: Iterable[RunningTask], *, priority: int, template: str | None
) -> RunningTask | None:
    """The lowest-priority, then newest, running task strictly below ``priority``.

    ``template``: only tasks of that template can free the needed slot (its template is
    full); None when only the global limit is full (any template will do).
    """
    eligible = [
        r for r in running if r.priority > priority and (template is None or r.template == template)
    ]
    return max(eligible, key=lambda r: (r.priority, r.start_seq), default=None)


@runtime_checkable
class Preemptor(Protocol):
    """The kernel's side of preemption (wired to the container engine)."""

    async def pause(self, task: Task[Any]) -> None:
        """PAUSE_SIGNAL over IPC, wait the grace period, then pause the sandbox."""

    async def resume(self, task: Task[Any]) -> None:
        """Unpause the sandbox, then RESUME_SIGNAL over IPC."""

    async def destroy(self, task: Task[Any]) -> None:
        """Destroy the task's sandbox (its coroutine is cancelled by the scheduler)."""
