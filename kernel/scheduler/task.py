"""The scheduler's data model (design: Scheduler Module, Task Model).

A :class:`Task` is what a caller submits: an id, a type, a fixed priority (1 = system,
highest, .. 5 = idle), the sandbox template it needs, the ids of tasks that must complete
first, a run-time bound and a ``run`` coroutine factory.  The scheduler owns its
``state``, ``result`` and ``error`` from submission on.  :class:`Limits` are the design's
concurrency limits; :class:`TaskSnapshot` and :class:`SchedulerStats` are read-only views.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar, get_args

import msgspec

from fluffy.errors import SchedulerError

T = TypeVar("T")

TaskType = Literal[
    "ai_generate", "test_run", "validate", "review", "commit", "tool_call", "pool_fill", "step"
]
TaskState = Literal[
    "queued", "waiting_dependency", "running", "paused", "completed", "failed", "cancelled"
]
TASK_TYPES: Final[tuple[TaskType, ...]] = get_args(TaskType)
TASK_STATES: Final[tuple[TaskState, ...]] = get_args(TaskState)
TERMINAL_STATES: Final[frozenset[TaskState]] = frozenset({"completed", "failed", "cancelled"})

#: The design's L2 sandbox templates (any other name gets ``Limits.default_per_template``).
TEMPLATES: Final = ("ai-provider", "code-executor", "policy-sandbox", "integration-test")
#: Work done in the kernel itself (no sandbox): it takes no slot and no limit applies;
#: such tasks exist for their dependencies (one tool call of a batch, ADR-043).
NO_SANDBOX: Final = "kernel"

PRIORITY_SYSTEM: Final = 1  # kernel/system work; never bumped, never outranked
PRIORITY_HIGH: Final = 2  # also the ceiling of starvation bumping
PRIORITY_NORMAL: Final = 3
PRIORITY_LOW: Final = 4
PRIORITY_IDLE: Final = 5
PRIORITIES: Final = (PRIORITY_SYSTEM, PRIORITY_HIGH, PRIORITY_NORMAL, PRIORITY_LOW, PRIORITY_IDLE)
BUMP_CEILING: Final = PRIORITY_HIGH

DEFAULT_MAX_DURATION_S: Final = 600.0


class TaskHandle:
    """What a running task's coroutine sees of its scheduling.

    ``await handle.checkpoint()`` returns at once while the task runs and blocks while
    the scheduler has it paused (cooperative pause; the real pause is the engine's,
    done by the :class:`~fluffy.kernel.scheduler.preempt.Preemptor`).
    """

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self._running = asyncio.Event()
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    async def checkpoint(self) -> None:
        await self._running.wait()

    def _pause(self) -> None:
        self._running.clear()

    def _resume(self) -> None:
        self._running.set()


@dataclass(eq=False)
class Task(Generic[T]):
    """One unit of work.  ``run(handle)`` is called once, when the task first starts."""

    id: str
    type: TaskType
    sandbox_template: str
    run: Callable[[TaskHandle], Awaitable[T]] = field(repr=False)
    priority: int = PRIORITY_NORMAL
    dependencies: tuple[str, ...] = ()
    max_duration_s: float = DEFAULT_MAX_DURATION_S
    #: Background work holding a slot it gives up (ADR-043): it never blocks a task of a
    #: strictly better priority (its owner frees the slot right after such a task
    #: starts), is never aged by starvation prevention and never preempted.
    yields: bool = False
    state: TaskState = field(default="queued", init=False)
    result: T | None = field(default=None, init=False, repr=False)
    error: BaseException | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.dependencies = tuple(self.dependencies)
        if not isinstance(self.id, str) or not self.id:
            raise SchedulerError(
                "a task needs a non-empty string id",
                why=f"got {self.id!r}",
                fix="Give each task a unique, non-empty id.",
            )
        if self.type not in TASK_TYPES:
            raise SchedulerError(
                f"task {self.id}: unknown type {self.type!r}",
                fix=f"Use one of: {', '.join(TASK_TYPES)}.",
                why="the scheduler orders and limits tasks by their type",
            )
        if isinstance(self.priority, bool) or self.priority not in PRIORITIES:
            raise SchedulerError(
                f"task {self.id}: priority {self.priority!r} is out of range",
                why="priorities are fixed integers, 1 (system, highest) to 5 (idle)",
                fix="Pass an integer from 1 to 5.",
            )
        if not self.sandbox_template:
            raise SchedulerError(
                f"task {self.id}: sandbox_template is empty",
                why="a task runs in a sandbox made from a template",
                fix="Name the sandbox template the task runs in.",
            )
        if not self.max_duration_s > 0:
            raise SchedulerError(
                f"task {self.id}: max_duration_s must be positive, got {self.max_duration_s!r}",
                why="a task's time limit must leave it time to run",
                fix="Give max_duration_s a positive number of seconds.",
            )
        if len(set(self.dependencies)) != len(self.dependencies):
            raise SchedulerError(
                f"task {self.id}: a dependency is listed twice",
                why="a task waits for each of its dependencies once",
                fix="List each dependency once.",
            )


@dataclass(frozen=True)
class Limits:
    """The design's concurrency limits (policy.yaml ``scheduler:``)."""

    global_max: int = 4
    per_template: Mapping[str, int] = field(
        default_factory=lambda: {"ai-provider": 2, "code-executor": 2, "policy-sandbox": 1}
    )
    default_per_template: int = 4

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_template", dict(self.per_template))
        for name, value in (
            ("global_max", self.global_max),
            ("default_per_template", self.default_per_template),
            *((f"per_template[{k!r}]", v) for k, v in self.per_template.items()),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SchedulerError(
                    f"scheduler limit {name} must be a positive integer, got {value!r}",
                    fix="Correct the scheduler section of policy.yaml.",
                    why="a limit counts tasks or sandboxes",
                )

    def for_template(self, template: str) -> int:
        return self.per_template.get(template, self.default_per_template)

    def as_dict(self) -> dict[str, Any]:
        return {"global_max": self.global_max, "per_template": dict(self.per_template)}


class TaskSnapshot(msgspec.Struct, frozen=True):
    """A task as the scheduler sees it at one moment."""

    id: str
    type: TaskType
    priority: int
    effective_priority: int  # after starvation bumping (queued/paused) or as dispatched
    state: TaskState
    sandbox_template: str
    dependencies: tuple[str, ...]
    elapsed_s: float  # time spent running (paused time excluded)
    reason: str | None  # the error's headline for failed/cancelled tasks


class SchedulerStats(msgspec.Struct, frozen=True):
    by_state: Mapping[TaskState, int]
    running_by_template: Mapping[str, int]
    accepting_work: bool
    paused_total: int
    resumed_total: int
    destroyed_total: int
    timed_out_total: int
    #: priority (as a string: JSON keys) -> tasks holding a slot, queued (or paused)
    running_by_priority: Mapping[str, int] = msgspec.field(default_factory=dict)
    queued_by_priority: Mapping[str, int] = msgspec.field(default_factory=dict)
    #: running tasks that give their slot up to better priorities (the warm pool's)
    yielding: int = 0
    #: slots held beyond a limit: reservations (the policy sandbox) admitted at once,
    #: and yielding slots not yet given back
    over_limit: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "by_state": dict(self.by_state),
            "running_by_template": dict(self.running_by_template),
            "running_by_priority": dict(self.running_by_priority),
            "queued_by_priority": dict(self.queued_by_priority),
            "yielding": self.yielding,
            "over_limit": self.over_limit,
            "accepting_work": self.accepting_work,
            "paused_total": self.paused_total,
            "resumed_total": self.resumed_total,
            "destroyed_total": self.destroyed_total,
            "timed_out_total": self.timed_out_total,
        }
