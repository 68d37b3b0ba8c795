"""What the scheduler shows: one task's snapshot, and the figures of all of them.

``kernel.ping`` and ``tool.status`` report these (``scheduler``): tasks by state, the
slots held by template and priority, the queue by effective priority, how far the
sandboxes are over the limits, and the preemption counters.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from fluffy.kernel.scheduler.queue import ReadyQueue
from fluffy.kernel.scheduler.record import TaskRecord, headline, holds_slot
from fluffy.kernel.scheduler.task import (
    TASK_STATES,
    Limits,
    SchedulerStats,
    TaskSnapshot,
    TaskState,
)


def snapshot(rec: TaskRecord, queue: ReadyQueue, now: float) -> TaskSnapshot:
    """``rec`` as it stands at ``now`` (its effective priority: the queue's while it
    waits, the one it was started with while it runs)."""
    if rec.id in queue:
        effective = queue.effective(rec.id, now)
    elif rec.task.state == "running":
        effective = rec.run_priority
    else:
        effective = rec.task.priority
    return TaskSnapshot(
        id=rec.id,
        type=rec.task.type,
        priority=rec.task.priority,
        effective_priority=effective,
        state=rec.task.state,
        sandbox_template=rec.task.sandbox_template,
        dependencies=rec.task.dependencies,
        elapsed_s=rec.elapsed(now),
        reason=headline(rec.task.error),
    )


def stats(
    records: Mapping[str, TaskRecord],
    running: Mapping[str, TaskRecord],
    queue: ReadyQueue,
    limits: Limits,
    *,
    now: float,
    accepting: bool,
    totals: Counter[str],
) -> SchedulerStats:
    """The figures of every task the scheduler knows (``running``: those holding a slot;
    ``totals``: the paused, resumed, destroyed and timed-out counts)."""
    by_state: dict[TaskState, int] = dict.fromkeys(TASK_STATES, 0)
    for rec in records.values():
        by_state[rec.task.state] += 1
    # one pass over the slot holders (kernel.ping shows these on every call)
    started: dict[str, int] = {}
    per_template: dict[str, int] = {}
    by_priority: dict[str, int] = {}
    holders = yielding = 0
    for r in running.values():
        if not holds_slot(r):
            continue
        template = r.task.sandbox_template
        holders += 1
        yielding += r.task.yields
        per_template[template] = per_template.get(template, 0) + 1
        if r.task.state == "running":
            started[template] = started.get(template, 0) + 1
        key = str(r.run_priority)
        by_priority[key] = by_priority.get(key, 0) + 1
    queued: Counter[str] = Counter(
        str(queue.effective(task_id, now)) for task_id in records if task_id in queue
    )
    over = max(0, holders - limits.global_max)
    over_templates = sum(max(0, n - limits.for_template(t)) for t, n in per_template.items())
    return SchedulerStats(
        by_state=by_state,
        running_by_template=started,
        running_by_priority=by_priority,
        queued_by_priority=dict(queued),
        yielding=yielding,
        over_limit=max(over, over_templates),
        accepting_work=accepting,
        paused_total=totals["paused"],
        resumed_total=totals["resumed"],
        destroyed_total=totals["destroyed"],
        timed_out_total=totals["timed_out"],
    )
