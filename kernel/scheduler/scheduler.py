"""The event-driven scheduler (design: Scheduler Module, Queue Management).

One asyncio task (the loop) makes every decision.  It wakes on an :class:`asyncio.Event`
set by submit, completion, failure, cancel and slot release, and otherwise sleeps until
the next computed instant: a starvation bump, a running task's ``max_duration`` deadline,
or (only while ``accepting_work()`` holds new starts back) a re-check of that flag.
Each task's coroutine runs in its own asyncio task (a runner) that records the outcome.

While ``accepting_work()`` is false (the kernel is above 80 % of its memory) nothing
starts, resumes or is preempted; running tasks go on and deadlines are still enforced.

A task's life: ``waiting_dependency`` -> ``queued`` -> ``running`` <-> ``paused`` ->
``completed`` | ``failed`` | ``cancelled``.  A failed or cancelled task fails its
dependents, transitively, with ``DependencyFailed("dependency failed: <id>")``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, Generic, TypeVar, cast

from fluffy.errors import SchedulerError, TaskCancelled
from fluffy.kernel.scheduler import figures
from fluffy.kernel.scheduler.preempt import Preemptor, RunningTask, decide, pick_victim
from fluffy.kernel.scheduler.queue import Entry, ReadyQueue
from fluffy.kernel.scheduler.record import (
    TaskRecord,
    check_submittable,
    closed_error,
    dependency_error,
    headline,
    holds_slot,
    unknown_task,
)
from fluffy.kernel.scheduler.task import (
    NO_SANDBOX,
    Limits,
    SchedulerStats,
    Task,
    TaskHandle,
    TaskSnapshot,
    TaskState,
)

log = logging.getLogger("fluffy.kernel.scheduler")

T = TypeVar("T")
MIN_WAIT_S: Final = 0.001  # floor of a computed sleep, so a timer never spins the loop
FAILED_PASS_BACKOFF_S: Final = 1.0


@dataclass(frozen=True)
class TaskRef(Generic[T]):
    """What :meth:`Scheduler.submit` returns: the task's id and shortcuts to it."""

    id: str
    scheduler: Scheduler = field(repr=False)

    async def result(self) -> T:
        return cast(T, await self.scheduler.result(self.id))

    def cancel(self) -> bool:
        return self.scheduler.cancel(self.id)

    def snapshot(self) -> TaskSnapshot:
        return self.scheduler.get(self.id)


class Scheduler:
    def __init__(
        self,
        limits: Limits,
        *,
        clock: Callable[[], float] = time.monotonic,
        memory_usage: Callable[[], float] = lambda: 0.0,
        preemptor: Preemptor | None = None,
        age_threshold_s: float = 30.0,
        accepting_work: Callable[[], bool] = lambda: True,
        recheck_s: float = 2.0,
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._memory_usage = memory_usage
        self._preemptor = preemptor
        self._accepting_work = accepting_work
        self._recheck_s = recheck_s
        self._queue = ReadyQueue(age_threshold_s)
        self._records: dict[str, TaskRecord] = {}
        self._running: dict[str, TaskRecord] = {}  # tasks holding a slot
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        self._held = False
        self._seq = 0
        self._start_seq = 0
        self._totals: Counter[str] = Counter()

    # -- public API --------------------------------------------------------------------

    def submit(self, task: Task[T]) -> TaskRef[T]:
        """Accept ``task`` (returns at once); it runs when its turn comes."""
        rec = self._register(task)
        failed: TaskRecord | None = None
        for dep_id in task.dependencies:
            dep = self._records[dep_id]
            dep.dependents.append(task.id)
            if dep.task.state in ("failed", "cancelled"):
                failed = failed or dep
            elif dep.task.state != "completed":
                rec.pending.add(dep_id)
        if failed is not None:
            self._finish(rec, "failed", error=dependency_error(rec, failed))
        elif not rec.pending:
            self._enqueue(rec, self._clock())
        self._wake.set()
        return TaskRef(task.id, self)

    def reserve(self, task: Task[T]) -> TaskRef[T]:
        """Start ``task`` now, limits or not, and count its slot from now on (ADR-043).

        For a long-lived sandbox that must never wait in the queue (the policy sandbox
        gates every decision): it holds its slot until its coroutine returns, is never
        preempted, and the slots it takes are missing for everything else."""
        if task.dependencies:
            raise SchedulerError(
                f"task {task.id}: a reservation cannot have dependencies",
                why="a reservation starts at once; it cannot wait for other tasks",
                fix="Submit the reservation without dependencies.",
            )
        rec = self._register(task)
        rec.unpreemptable = True
        self._start(rec, task.priority, self._clock())
        self._wake.set()
        return TaskRef(task.id, self)

    def _register(self, task: Task[Any]) -> TaskRecord:
        check_submittable(task, self._records, closed=self._closed)
        self._seq += 1
        rec = TaskRecord(task, self._seq, TaskHandle(task.id))
        task.state, task.result, task.error = "waiting_dependency", None, None
        self._records[task.id] = rec
        return rec

    async def result(self, task_id: str) -> Any:
        """The task's value once it ends; raises its error (or why it never ran)."""
        rec = self._record(task_id)
        await rec.done.wait()
        if rec.task.error is not None:
            raise rec.task.error
        return rec.task.result

    def forget(self, task_id: str) -> bool:
        """Drop an ended task that nothing depends on any more (a long-lived kernel
        submits a task per tool call).  False if it has not ended or a live task
        still waits on it."""
        rec = self._records.get(task_id)
        if rec is None or not rec.terminal:
            return False
        if any(not self._records[d].terminal for d in rec.dependents if d in self._records):
            return False
        del self._records[task_id]
        return True

    def cancel(self, task_id: str) -> bool:
        """Cancel a task that has not ended (False if it had); its dependents fail."""
        rec = self._record(task_id)
        return self._finish(
            rec,
            "cancelled",
            error=TaskCancelled(
                f"task {task_id} was cancelled",
                why=f"cancel() was called while it was {rec.task.state}",
            ),
        )

    def get(self, task_id: str) -> TaskSnapshot:
        rec = self._record(task_id)
        return figures.snapshot(rec, self._queue, self._clock())

    def stats(self) -> SchedulerStats:
        return figures.stats(
            self._records,
            self._running,
            self._queue,
            self.limits,
            now=self._clock(),
            accepting=self._accepting(),
            totals=self._totals,
        )

    def slots(self) -> list[tuple[str, bool]]:
        """(template, yields) of each task holding a slot now (running or resuming)."""
        return [
            (r.task.sandbox_template, r.task.yields)
            for r in self._running.values()
            if holds_slot(r)
        ]

    def wake(self) -> None:
        """Re-evaluate now (e.g. after memory use dropped back below 80 %)."""
        self._wake.set()

    async def start(self) -> None:
        if self._closed:
            raise closed_error("start it")
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._main(), name="fluffy-scheduler")

    async def close(self) -> None:
        """Stop the loop, cancel every task that has not ended, and wait for the runners."""
        self._closed = True
        loop_task, self._loop_task = self._loop_task, None
        if loop_task is not None:
            loop_task.cancel()
            await asyncio.wait({loop_task})
        for rec in list(self._records.values()):
            error = TaskCancelled(
                f"task {rec.id} was cancelled: the scheduler closed",
                why="close() cancels every queued, waiting, running and paused task",
            )
            self._finish(rec, "cancelled", error=error, propagate=False)
        runners = {r.runner for r in self._records.values() if r.runner and not r.runner.done()}
        if runners:
            await asyncio.wait(runners)

    # -- the loop ----------------------------------------------------------------------

    async def _main(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._dispatch()
            except Exception:
                log.exception("scheduler pass failed; retrying after %s s", FAILED_PASS_BACKOFF_S)
                await asyncio.sleep(FAILED_PASS_BACKOFF_S)  # a bug must not spin the loop
                continue
            if self._wake.is_set():
                continue
            try:
                async with asyncio.timeout(self._timeout()):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _timeout(self) -> float | None:
        now = self._clock()
        times = [d for r in self._running.values() if (d := r.deadline()) is not None]
        if (bump := self._queue.next_bump_at(now)) is not None:
            times.append(bump)
        if self._held and len(self._queue):
            times.append(now + self._recheck_s)
        return max(min(times) - now, MIN_WAIT_S) if times else None

    async def _dispatch(self) -> None:
        while True:
            now = self._clock()
            self._enforce_deadlines(now)
            self._held = not self._accepting()
            if self._held or not len(self._queue) or not await self._step(now):
                return

    async def _step(self, now: float) -> bool:
        """Start, resume or preempt for the best task that can use a slot; False if none."""
        for effective, entry in self._queue.ordered(now):
            rec = self._records[entry.task_id]
            template = rec.task.sandbox_template
            if template == NO_SANDBOX:  # takes no slot
                await self._launch(rec, effective, entry, now)
                return True
            # yielding slots (the warm pool's) do not count against better priorities
            holders = [
                r
                for r in self._running.values()
                if holds_slot(r) and not (r.task.yields and r.run_priority > effective)
            ]
            in_template = sum(1 for r in holders if r.task.sandbox_template == template)
            template_full = in_template >= self.limits.for_template(template)
            if not template_full and len(holders) < self.limits.global_max:
                await self._launch(rec, effective, entry, now)
                return True
            if self._preemptor is None:
                continue
            victim = self._victim(effective, template if template_full else None)
            if victim is None:
                continue
            decision = decide(victim.elapsed(now), victim.task.max_duration_s, self._memory())
            level = logging.DEBUG if decision == "wait" else logging.INFO
            log.log(level, "task %s needs a slot: %s task %s", rec.id, decision, victim.id)
            if decision == "pause":
                await self._pause(victim)
                return True
            if decision == "destroy":
                await self._destroy(victim, rec, effective)
                return True
        return False

    def _victim(self, priority: int, template: str | None) -> TaskRecord | None:
        running = [
            RunningTask(r.id, r.task.sandbox_template, r.run_priority, r.start_seq)
            for r in self._running.values()
            if r.task.state == "running"
            and not r.unpreemptable
            and not r.task.yields  # it gives its slot up by itself
            and holds_slot(r)
        ]
        choice = pick_victim(running, priority=priority, template=template)
        return None if choice is None else self._records[choice.task_id]

    async def _launch(self, rec: TaskRecord, effective: int, entry: Entry, now: float) -> None:
        self._queue.remove(rec.id)
        if not entry.paused:
            self._start(rec, effective, now)
            return
        rec.run_priority = effective
        self._running[rec.id] = rec  # holds the slot from here on (also while resuming)
        assert self._preemptor is not None  # only a preemptor pauses tasks
        try:
            await self._preemptor.resume(rec.task)
        except Exception as exc:
            log.warning("could not resume task %s: %s", rec.id, exc)
            error = TaskCancelled(
                f"task {rec.id} could not be resumed after preemption",
                why=headline(exc),
                fix="Submit it again.",
            )
            self._finish(rec, "failed", error=error)
            return
        if rec.terminal:  # cancelled or ended while resuming
            return
        rec.task.state, rec.run_since = "running", self._clock()
        rec.handle._resume()
        self._totals["resumed"] += 1

    def _start(self, rec: TaskRecord, effective: int, now: float) -> None:
        rec.run_priority = effective
        self._running[rec.id] = rec  # holds the slot from here on
        self._start_seq += 1
        rec.start_seq = self._start_seq
        rec.task.state, rec.run_since = "running", now
        rec.runner = asyncio.create_task(self._run(rec), name=f"fluffy-task-{rec.id}")
        rec.runner.add_done_callback(partial(self._runner_exited, rec))

    async def _pause(self, victim: TaskRecord) -> None:
        assert self._preemptor is not None
        victim.handle._pause()
        try:
            await self._preemptor.pause(victim.task)
        except Exception as exc:
            log.warning("could not pause task %s, it keeps running: %s", victim.id, exc)
            victim.handle._resume()
            victim.unpreemptable = True
            return
        if victim.terminal:
            return
        now = self._clock()
        victim.stop_clock(now)
        self._running.pop(victim.id, None)
        self._queue.push(Entry(victim.id, victim.run_priority, victim.seq, now, paused=True))
        victim.task.state = "paused"
        self._totals["paused"] += 1

    async def _destroy(self, victim: TaskRecord, requester: TaskRecord, priority: int) -> None:
        assert self._preemptor is not None
        error = TaskCancelled(
            f"task {victim.id} was preempted: its sandbox was destroyed for task {requester.id}",
            why=f"a priority-{priority} task needed its slot while memory use was above 80 %",
            fix="Submit it again once memory use is lower.",
        )
        runner = victim.runner
        self._finish(victim, "failed", error=error, cancel_runner=False)
        self._totals["destroyed"] += 1
        try:
            await self._preemptor.destroy(victim.task)
        except Exception as exc:
            log.warning("could not destroy task %s's sandbox: %s", victim.id, exc)
        finally:
            if runner is not None and not runner.done():
                runner.cancel()

    def _enforce_deadlines(self, now: float) -> None:
        for rec in list(self._running.values()):
            deadline = rec.deadline()
            if rec.task.state == "running" and deadline is not None and now >= deadline:
                self._totals["timed_out"] += 1
                error = TaskCancelled(
                    f"task {rec.id} ran past its max_duration ({rec.task.max_duration_s:g} s)",
                    why="max_duration_s bounds a task's running time (paused time excluded)",
                    fix="Raise the task's max_duration_s, or split the work.",
                )
                self._finish(rec, "failed", error=error)

    # -- runners and bookkeeping -------------------------------------------------------

    async def _run(self, rec: TaskRecord) -> None:
        try:
            value = await rec.task.run(rec.handle)
        except asyncio.CancelledError:
            error = TaskCancelled(f"task {rec.id} was cancelled", why="its coroutine was cancelled")
            self._finish(rec, "cancelled", error=error, cancel_runner=False)
        except Exception as exc:
            self._finish(rec, "failed", error=exc, cancel_runner=False)
        else:
            self._finish(rec, "completed", value=value, cancel_runner=False)

    def _runner_exited(self, rec: TaskRecord, _runner: asyncio.Task[None]) -> None:
        rec.runner_exited = True
        if not rec.terminal:  # cancelled before its first step
            error = TaskCancelled(f"task {rec.id} was cancelled before it began")
            self._finish(rec, "cancelled", error=error, cancel_runner=False)
        rec.done.set()
        self._wake.set()

    def _finish(
        self,
        rec: TaskRecord,
        state: TaskState,
        *,
        value: object = None,
        error: BaseException | None = None,
        cancel_runner: bool = True,
        propagate: bool = True,
    ) -> bool:
        """End ``rec``, then release its dependents (completed) or fail them, transitively."""
        if not self._terminate(rec, state, value, error, cancel_runner=cancel_runner):
            return False
        now = self._clock()
        if state == "completed":
            for dep_id in rec.dependents:
                dependent = self._records[dep_id]
                dependent.pending.discard(rec.id)
                if dependent.task.state == "waiting_dependency" and not dependent.pending:
                    self._enqueue(dependent, now)
            return True
        failed = [rec] if propagate else []
        while failed:
            source = failed.pop()
            for dep_id in source.dependents:
                dependent = self._records[dep_id]
                reason = dependency_error(dependent, source)
                if self._terminate(dependent, "failed", None, reason, cancel_runner=True):
                    failed.append(dependent)
        return True

    def _terminate(
        self,
        rec: TaskRecord,
        state: TaskState,
        value: object,
        error: BaseException | None,
        *,
        cancel_runner: bool,
    ) -> bool:
        """Move one task to a terminal state and free its slot (False if it had ended)."""
        if rec.terminal:
            return False
        rec.stop_clock(self._clock())
        self._queue.remove(rec.id)
        self._running.pop(rec.id, None)
        rec.task.state, rec.task.result, rec.task.error = state, value, error
        if rec.runner is None or rec.runner_exited:
            rec.done.set()
        elif cancel_runner:
            rec.runner.cancel()
        self._wake.set()
        return True

    def _enqueue(self, rec: TaskRecord, now: float) -> None:
        rec.task.state = "queued"
        self._queue.push(Entry(rec.id, rec.task.priority, rec.seq, now, ages=not rec.task.yields))
        self._wake.set()

    def _record(self, task_id: str) -> TaskRecord:
        try:
            return self._records[task_id]
        except KeyError:
            raise unknown_task(task_id) from None

    def _accepting(self) -> bool:
        try:
            return bool(self._accepting_work())
        except Exception as exc:
            log.warning("accepting_work() failed, holding new starts: %s", exc)
            return False

    def _memory(self) -> float:
        try:
            return float(self._memory_usage())
        except Exception as exc:
            log.warning("memory_usage() failed, assuming low memory: %s", exc)
            return 0.0
