"""The kernel's scheduler (design: Scheduler Module): when each task runs.

Fixed priorities (1 system .. 5 idle) with starvation bumping, FIFO within a priority,
per-template and global concurrency limits, a dependency DAG with failure propagation,
and preemption (wait / destroy / pause) through the kernel's :class:`Preemptor`.
"""

from fluffy.kernel.scheduler.preempt import Decision, Preemptor, decide, pick_victim
from fluffy.kernel.scheduler.queue import ReadyQueue, effective_priority
from fluffy.kernel.scheduler.scheduler import Scheduler, TaskRef
from fluffy.kernel.scheduler.task import (
    NO_SANDBOX,
    PRIORITY_HIGH,
    PRIORITY_IDLE,
    PRIORITY_LOW,
    PRIORITY_NORMAL,
    PRIORITY_SYSTEM,
    TEMPLATES,
    Limits,
    SchedulerStats,
    Task,
    TaskHandle,
    TaskSnapshot,
    TaskState,
    TaskType,
)

__all__ = [
    "NO_SANDBOX",
    "PRIORITY_HIGH",
    "PRIORITY_IDLE",
    "PRIORITY_LOW",
    "PRIORITY_NORMAL",
    "PRIORITY_SYSTEM",
    "TEMPLATES",
    "Decision",
    "Limits",
    "Preemptor",
    "ReadyQueue",
    "Scheduler",
    "SchedulerStats",
    "Task",
    "TaskHandle",
    "TaskRef",
    "TaskSnapshot",
    "TaskState",
    "TaskType",
    "decide",
    "effective_priority",
    "pick_victim",
]
