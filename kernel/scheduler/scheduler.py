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

from fluffy.errors import DependencyFailed, SchedulerError, TaskCancelled
from fluffy.kernel.scheduler.preempt import Preemptor, RunningTask, decide, pick_victim
from fluffy.kernel.scheduler.queue import Entry, ReadyQueue
from fluffy.kernel.scheduler.task import (
    NO_SANDBOX,
    TASK_STATES,
    TERMINAL_STATES,
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


@dataclass(eq=False)
class _Record:
    task: Task[Any]
    seq: int
    handle: TaskHandle
    pending: set[str] = field(default_factory=set)  # dependencies not yet completed
    dependents: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
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

    def deadline(self) -> float | None:
        if self.run_since is None:
            return None
        return self.run_since + (self.task.max_duration_s - self.run_time)


def _holds_slot(rec: _Record) -> bool:
    return rec.task.sandbox_template != NO_SANDBOX


def _headline(error: BaseException | None) -> str | None:
    if error is None:
        return None
    return getattr(error, "what", None) or str(error) or type(error).__name__


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
        self._records: dict[str, _Record] = {}
        self._running: dict[str, _Record] = {}  # tasks holding a slot
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
        failed: _Record | None = None
        for dep_id in task.dependencies:
            dep = self._records[dep_id]
            dep.dependents.append(task.id)
            if dep.task.state in ("failed", "cancelled"):
                failed = failed or dep
            elif dep.task.state != "completed":
                rec.pending.add(dep_id)
        if failed is not None:
            self._finish(rec, "failed", error=self._dependency_error(rec, failed))
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
            )
        rec = self._register(task)
        rec.unpreemptable = True
        self._start(rec, task.priority, self._clock())
        self._wake.set()
        return TaskRef(task.id, self)

    def _register(self, task: Task[Any]) -> _Record:
        if self._closed:
            raise SchedulerError(
                f"cannot submit task {task.id}: the scheduler is closed",
                why="close() was called; a closed scheduler takes no new tasks",
            )
        if task.id in self._records:
            raise SchedulerError(
                f"task id {task.id!r} is already taken",
                why="ids name tasks and dependency edges, so they must be unique",
                fix="Give every task a fresh id.",
            )
        unknown = [d for d in task.dependencies if d not in self._records]
        if unknown:
            raise SchedulerError(
                f"task {task.id} depends on unknown task(s): {', '.join(unknown)}",
                why="dependencies must be submitted before the tasks that need them "
                "(this is what makes dependency cycles impossible)",
                fix="Submit the dependencies first, then this task.",
            )
        self._seq += 1
        rec = _Record(task, self._seq, TaskHandle(task.id))
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
        now = self._clock()
        if rec.id in self._queue:
            effective = self._queue.effective(rec.id, now)
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
            reason=_headline(rec.task.error),
        )

    def stats(self) -> SchedulerStats:
        by_state: dict[TaskState, int] = dict.fromkeys(TASK_STATES, 0)
        for rec in self._records.values():
            by_state[rec.task.state] += 1
        holders = [r for r in self._running.values() if _holds_slot(r)]
        running: Counter[str] = Counter(
            r.task.sandbox_template for r in holders if r.task.state == "running"
        )
        now = self._clock()
        queued: Counter[str] = Counter(
            str(self._queue.effective(task_id, now))
            for task_id in self._records
            if task_id in self._queue
        )
        over = max(0, len(holders) - self.limits.global_max)
        per_template: Counter[str] = Counter(r.task.sandbox_template for r in holders)
        over_templates = sum(
            max(0, n - self.limits.for_template(t)) for t, n in per_template.items()
        )
        return SchedulerStats(
            by_state=by_state,
            running_by_template=dict(running),
            running_by_priority=dict(Counter(str(r.run_priority) for r in holders)),
            queued_by_priority=dict(queued),
            yielding=sum(1 for r in holders if r.task.yields),
            over_limit=max(over, over_templates),
            accepting_work=self._accepting(),
            paused_total=self._totals["paused"],
            resumed_total=self._totals["resumed"],
            destroyed_total=self._totals["destroyed"],
            timed_out_total=self._totals["timed_out"],
        )

    def slots(self) -> list[tuple[str, bool]]:
        """(template, yields) of each task holding a slot now (running or resuming)."""
        return [
            (r.task.sandbox_template, r.task.yields)
            for r in self._running.values()
            if _holds_slot(r)
        ]

    def wake(self) -> None:
        """Re-evaluate now (e.g. after memory use dropped back below 80 %)."""
        self._wake.set()

    async def start(self) -> None:
        if self._closed:
            raise SchedulerError("cannot start a closed scheduler")
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
                if _holds_slot(r) and not (r.task.yields and r.run_priority > effective)
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

    def _victim(self, priority: int, template: str | None) -> _Record | None:
        running = [
            RunningTask(r.id, r.task.sandbox_template, r.run_priority, r.start_seq)
            for r in self._running.values()
            if r.task.state == "running"
            and not r.unpreemptable
            and not r.task.yields  # it gives its slot up by itself
            and _holds_slot(r)
        ]
        choice = pick_victim(running, priority=priority, template=template)
        return None if choice is None else self._records[choice.task_id]

    async def _launch(self, rec: _Record, effective: int, entry: Entry, now: float) -> None:
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
                why=_headline(exc),
                fix="Submit it again.",
            )
            self._finish(rec, "failed", error=error)
            return
        if rec.terminal:  # cancelled or ended while resuming
            return
        rec.task.state, rec.run_since = "running", self._clock()
        rec.handle._resume()
        self._totals["resumed"] += 1

    def _start(self, rec: _Record, effective: int, now: float) -> None:
        rec.run_priority = effective
        self._running[rec.id] = rec  # holds the slot from here on
        self._start_seq += 1
        rec.start_seq = self._start_seq
        rec.task.state, rec.run_since = "running", now
        rec.runner = asyncio.create_task(self._run(rec), name=f"fluffy-task-{rec.id}")
        rec.runner.add_done_callback(partial(self._runner_exited, rec))

    async def _pause(self, victim: _Record) -> None:
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
        self._stop_clock(victim, now)
        self._running.pop(victim.id, None)
        self._queue.push(Entry(victim.id, victim.run_priority, victim.seq, now, paused=True))
        victim.task.state = "paused"
        self._totals["paused"] += 1

    async def _destroy(self, victim: _Record, requester: _Record, priority: int) -> None:
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

    async def _run(self, rec: _Record) -> None:
        try:
            value = await rec.task.run(rec.handle)
        except asyncio.CancelledError:
            error = TaskCancelled(f"task {rec.id} was cancelled", why="its coroutine was cancelled")
            self._finish(rec, "cancelled", error=error, cancel_runner=False)
        except Exception as exc:
            self._finish(rec, "failed", error=exc, cancel_runner=False)
        else:
            self._finish(rec, "completed", value=value, cancel_runner=False)

    def _runner_exited(self, rec: _Record, _runner: asyncio.Task[None]) -> None:
        rec.runner_exited = True
        if not rec.terminal:  # cancelled before its first step
            error = TaskCancelled(f"task {rec.id} was cancelled before it began")
            self._finish(rec, "cancelled", error=error, cancel_runner=False)
        rec.done.set()
        self._wake.set()

    def _finish(
        self,
        rec: _Record,
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
                reason = self._dependency_error(dependent, source)
                if self._terminate(dependent, "failed", None, reason, cancel_runner=True):
                    failed.append(dependent)
        return True

    def _terminate(
        self,
        rec: _Record,
        state: TaskState,
        value: object,
        error: BaseException | None,
        *,
        cancel_runner: bool,
    ) -> bool:
        """Move one task to a terminal state and free its slot (False if it had ended)."""
        if rec.terminal:
            return False
        self._stop_clock(rec, self._clock())
        self._queue.remove(rec.id)
        self._running.pop(rec.id, None)
        rec.task.state, rec.task.result, rec.task.error = state, value, error
        if rec.runner is None or rec.runner_exited:
            rec.done.set()
        elif cancel_runner:
            rec.runner.cancel()
        self._wake.set()
        return True

    def _dependency_error(self, rec: _Record, failed: _Record) -> DependencyFailed:
        verb = "was cancelled" if failed.task.state == "cancelled" else "failed"
        return DependencyFailed(
            f"dependency failed: {failed.id}",
            why=f"{rec.id} depends on {failed.id}, which {verb}: {_headline(failed.task.error)}",
        )

    def _enqueue(self, rec: _Record, now: float) -> None:
        rec.task.state = "queued"
        self._queue.push(Entry(rec.id, rec.task.priority, rec.seq, now, ages=not rec.task.yields))
        self._wake.set()

    @staticmethod
    def _stop_clock(rec: _Record, now: float) -> None:
        if rec.run_since is not None:
            rec.run_time += now - rec.run_since
            rec.run_since = None

    def _record(self, task_id: str) -> _Record:
        try:
            return self._records[task_id]
        except KeyError:
            raise SchedulerError(f"no task with id {task_id!r}") from None

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
