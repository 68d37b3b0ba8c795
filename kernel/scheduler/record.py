"""The scheduler's record of one task, between its submission and its end.

:class:`TaskRecord` holds what :class:`~fluffy.kernel.scheduler.task.Task` does not: the
dependencies it still waits for and the tasks waiting for it, the runner that runs its
coroutine, its effective priority and start order, and its running time (paused time
excluded, for ``max_duration_s``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import msgspec

from fluffy.errors import DependencyFailed, SchedulerError
from fluffy.kernel.scheduler.task import NO_SANDBOX, TERMINAL_STATES, Task, TaskHandle


class TaskRecord(msgspec.Struct, eq=False):
    """The scheduler's book on one task: its links, runner and running time."""

    task: Task[Any]
    seq: int
    handle: TaskHandle
    pending: set[str] = msgspec.field(default_factory=set)  # dependencies not yet completed
    dependents: list[str] = msgspec.field(default_factory=list)
    done: asyncio.Event = msgspec.field(default_factory=asyncio.Event)
    runner: asyncio.Task[None] | None = None
    runner_exited: bool = False
    run_priority: int = 0  # effective priority when (re)dispatched
    start_seq: int = 0  # order of first start (newest = highest)
    run_since: float | None = None  # start of the current running interval
    run_time: float = 0.0  # running time before run_since
    unpreemptable: bool = False  # its pause failed once; never picked again

    @property
    def id(self) -> str:
        return self.task.id

    @property
    def terminal(self) -> bool:
        return self.task.state in TERMINAL_STATES

    def elapsed(self, now: float) -> float:
        return self.run_time + (now - self.run_since if self.run_since is not None else 0.0)

    def stop_clock(self, now: float) -> None:
        """End the current running interval (paused, or ended) at ``now``."""
        if self.run_since is not None:
            self.run_time += now - self.run_since
            self.run_since = None

    def deadline(self) -> float | None:
        if self.run_since is None:
            return None
        return self.run_since + (self.task.max_duration_s - self.run_time)


def holds_slot(rec: TaskRecord) -> bool:
    """Does the task count against the sandbox limits (it runs in a sandbox)?"""
    return rec.task.sandbox_template != NO_SANDBOX


def headline(error: BaseException | None) -> str | None:
    """What a task's error says in one line (a snapshot's and a dependent's reason)."""
    if error is None:
        return None
    return getattr(error, "what", None) or str(error) or type(error).__name__


def check_submittable(task: Task[Any], known: Mapping[str, TaskRecord], *, closed: bool) -> None:
    """Refuse ``task`` if the scheduler is closed, its id is taken, or it depends on a
    task not submitted before it (``known``: the scheduler's records by id)."""
    if closed:
        raise SchedulerError(
            f"cannot submit task {task.id}: the scheduler is closed",
            why="close() was called; a closed scheduler takes no new tasks",
            fix="Submit work before the kernel stops; a new kernel start makes a new scheduler.",
        )
    if task.id in known:
        raise SchedulerError(
            f"task id {task.id!r} is already taken",
            why="ids name tasks and dependency edges, so they must be unique",
            fix="Give every task a fresh id.",
        )
    unknown = [d for d in task.dependencies if d not in known]
    if unknown:
        raise SchedulerError(
            f"task {task.id} depends on unknown task(s): {', '.join(unknown)}",
            why="dependencies must be submitted before the tasks that need them "
            "(this is what makes dependency cycles impossible)",
            fix="Submit the dependencies first, then this task.",
        )


def dependency_error(rec: TaskRecord, failed: TaskRecord) -> DependencyFailed:
    """Why ``rec`` fails: its dependency ``failed`` failed or was cancelled."""
    verb = "was cancelled" if failed.task.state == "cancelled" else "failed"
    return DependencyFailed(
        f"dependency failed: {failed.id}",
        why=f"{rec.id} depends on {failed.id}, which {verb}: {headline(failed.task.error)}",
    )


def closed_error(doing: str) -> SchedulerError:
    """The scheduler was closed (the kernel is stopping): nothing new runs."""
    return SchedulerError(
        f"cannot {doing}: the scheduler is closed",
        why="close() was called; a closed scheduler runs nothing",
        fix="Make a new scheduler (the kernel does at its next start).",
    )


def unknown_task(task_id: str) -> SchedulerError:
    return SchedulerError(
        f"no task with id {task_id!r}",
        why="the task finished and was forgotten, or was never submitted",
        fix="Look the task up by the id submit() returned, while it runs.",
    )
