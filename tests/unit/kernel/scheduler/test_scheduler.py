"""The event-driven Scheduler: ordering, limits, dependencies, preemption, timeouts, close.

Tasks are gated coroutines (they start, record it, and wait for the test to release
them); time is a fake clock the tests advance, followed by ``scheduler.wake()``.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluffy.errors import DependencyFailed, SchedulerError, TaskCancelled
from fluffy.kernel.scheduler import TEMPLATES, Limits, Scheduler, Task, TaskHandle, TaskRef


def async_test(fn: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    def test() -> None:
        asyncio.run(asyncio.wait_for(fn(), 20))

    test.__name__ = fn.__name__
    test.__doc__ = fn.__doc__
    return test


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakePreemptor:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail: set[str] = set()

    async def _record(self, action: str, task: Task[Any]) -> None:
        self.calls.append((action, task.id))
        await asyncio.sleep(0)
        if action in self.fail:
            raise RuntimeError(f"{action} failed")

    async def pause(self, task: Task[Any]) -> None:
        await self._record("pause", task)

    async def resume(self, task: Task[Any]) -> None:
        await self._record("resume", task)

    async def destroy(self, task: Task[Any]) -> None:
        await self._record("destroy", task)


class Harness:
    def __init__(self, limits: Limits | None = None, **kwargs: Any) -> None:
        self.clock = FakeClock()
        kwargs.setdefault("clock", self.clock)
        self.sched = Scheduler(limits or Limits(), **kwargs)
        self.started: list[str] = []
        self.progress: list[str] = []
        self.cancelled: set[str] = set()
        self.gates: dict[str, asyncio.Event] = {}
        self.handles: dict[str, TaskHandle] = {}

    def add(
        self,
        task_id: str,
        *,
        priority: int = 3,
        template: str = "code-executor",
        deps: tuple[str, ...] = (),
        hold: bool = True,
        error: BaseException | None = None,
        max_duration_s: float = 600.0,
    ) -> TaskRef[str]:
        gate = self.gates[task_id] = asyncio.Event()
        if not hold:
            gate.set()

        async def run(handle: TaskHandle) -> str:
            self.started.append(task_id)
            self.progress.append(f"start:{task_id}")
            self.handles[task_id] = handle
            try:
                await gate.wait()
                self.progress.append(f"{task_id}:gate")
                await handle.checkpoint()
                self.progress.append(f"{task_id}:end")
            except asyncio.CancelledError:
                self.cancelled.add(task_id)
                raise
            if error is not None:
                raise error
            return f"{task_id}-value"

        task = Task(
            task_id,
            "tool_call",
            template,
            run,
            priority=priority,
            dependencies=deps,
            max_duration_s=max_duration_s,
        )
        return self.sched.submit(task)

    def release(self, *task_ids: str) -> None:
        for task_id in task_ids:
            self.gates[task_id].set()

    def state(self, task_id: str) -> str:
        return self.sched.get(task_id).state

    def running(self) -> set[str]:
        return {t for t in self.gates if self.state(t) == "running"}

    async def settle(self) -> None:
        for _ in range(100):
            await asyncio.sleep(0)

    async def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.sched.wake()
        await self.settle()

    async def finish_all(self) -> None:
        for gate in self.gates.values():
            gate.set()
        await asyncio.gather(*(self.sched.result(t) for t in self.gates), return_exceptions=True)


async def error_of(sched: Scheduler, task_id: str) -> BaseException:
    with pytest.raises(BaseException) as info:
        await sched.result(task_id)
    return info.value


# -- ordering --------------------------------------------------------------------------


@async_test
async def test_highest_priority_runs_first() -> None:
    h = Harness(Limits(global_max=1))
    for task_id, priority in [("n3", 3), ("s1", 1), ("i5", 5), ("h2", 2), ("l4", 4)]:
        h.add(task_id, priority=priority, hold=False)
    await h.sched.start()
    await h.finish_all()
    assert h.started == ["s1", "h2", "n3", "l4", "i5"]
    await h.sched.close()


@async_test
async def test_fifo_within_a_priority() -> None:
    h = Harness(Limits(global_max=1))
    for task_id, priority in [("z", 4), ("y", 2), ("x", 4), ("w", 2), ("v", 4), ("u", 2)]:
        h.add(task_id, priority=priority, hold=False)
    await h.sched.start()
    await h.finish_all()
    assert h.started == ["y", "w", "u", "z", "x", "v"]
    await h.sched.close()


@pytest.mark.parametrize(("waited", "first"), [(29.9, "fresh4"), (30.0, "old5")])
def test_starvation_bump_after_one_threshold(waited: float, first: str) -> None:
    async def main() -> None:
        h = Harness(Limits(global_max=1), age_threshold_s=30.0)
        await h.sched.start()
        h.add("blocker", priority=1)
        await h.settle()
        h.add("old5", priority=5, hold=False)
        await h.tick(waited)
        h.add("fresh4", priority=4, hold=False)
        await h.settle()
        assert h.sched.get("old5").effective_priority == (4 if first == "old5" else 5)
        h.release("blocker")
        await h.finish_all()
        assert h.started[1] == first
        await h.sched.close()

    asyncio.run(main())


@async_test
async def test_starvation_bump_is_one_level_per_threshold_capped_at_2() -> None:
    h = Harness(Limits(global_max=1), age_threshold_s=30.0)
    await h.sched.start()
    h.add("blocker", priority=1, max_duration_s=1e9)
    await h.settle()
    h.add("old5", priority=5, hold=False)
    await h.tick(65.0)  # two whole thresholds: 5 -> 3
    h.add("fresh3", priority=3, hold=False)
    h.add("fresh2", priority=2, hold=False)
    await h.settle()
    assert h.sched.get("old5").effective_priority == 3
    await h.tick(10_000.0)  # capped at 2 ...
    h.add("sys1", priority=1, hold=False)  # ... and never above priority 1
    h.add("late2", priority=2, hold=False)
    await h.settle()
    assert h.sched.get("old5").effective_priority == 2
    assert h.sched.get("sys1").effective_priority == 1
    h.release("blocker")
    await h.finish_all()
    # old5, fresh3 (aged 10 000 s) and the priority-2 tasks all share 2: FIFO among them
    assert h.started == ["blocker", "sys1", "old5", "fresh3", "fresh2", "late2"]
    await h.sched.close()


@async_test
async def test_a_starving_task_is_woken_by_the_timer_not_by_polling() -> None:
    """Real clock: the loop sleeps until the computed bump, then preempts for it."""
    preemptor = FakePreemptor()
    h = Harness(
        Limits(global_max=1), clock=time.monotonic, preemptor=preemptor, age_threshold_s=0.05
    )
    await h.sched.start()
    h.add("runner4", priority=4)
    await h.settle()
    h.add("starving5", priority=5, hold=False)
    await h.settle()
    assert preemptor.calls == []  # 5 does not outrank 4 yet
    deadline = time.monotonic() + 10
    while not preemptor.calls and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert preemptor.calls[0] == ("pause", "runner4")  # bumped to 3 (and then 2)
    await h.finish_all()
    await h.sched.close()


@async_test
async def test_idle_loop_does_not_poll() -> None:
    h = Harness()
    await h.sched.start()
    h.add("a", priority=3)
    h.add("b", priority=3, deps=("a",))
    await h.settle()
    before = h.clock.calls
    await asyncio.sleep(0.05)
    assert h.clock.calls == before
    await h.finish_all()
    await h.sched.close()


# -- concurrency limits ----------------------------------------------------------------


@async_test
async def test_per_template_limits() -> None:
    h = Harness(Limits(global_max=100))
    counts = {
        "ai-provider": 3,
        "code-executor": 3,
        "policy-sandbox": 2,
        "integration-test": 6,
        "custom": 5,
    }
    for template, n in counts.items():
        for i in range(n):
            h.add(f"{template}-{i}", template=template)
    await h.sched.start()
    await h.settle()
    assert h.sched.stats().running_by_template == {
        "ai-provider": 2,
        "code-executor": 2,
        "policy-sandbox": 1,
        "integration-test": 4,
        "custom": 4,
    }
    assert h.state("ai-provider-2") == "queued"
    h.release("ai-provider-0")
    await h.settle()
    assert h.state("ai-provider-0") == "completed"
    assert h.state("ai-provider-2") == "running"
    await h.finish_all()
    await h.sched.close()


@async_test
async def test_global_limit() -> None:
    h = Harness()  # global_max 4
    for task_id, template in [
        ("ai0", "ai-provider"),
        ("code0", "code-executor"),
        ("pol0", "policy-sandbox"),
        ("int0", "integration-test"),
        ("int1", "integration-test"),
        ("ai1", "ai-provider"),
    ]:
        h.add(task_id, template=template)
    await h.sched.start()
    await h.settle()
    assert h.running() == {"ai0", "code0", "pol0", "int0"}
    h.release("pol0")
    await h.settle()
    assert h.running() == {"ai0", "code0", "int0", "int1"}
    await h.finish_all()
    await h.sched.close()


@async_test
async def test_full_template_does_not_block_other_templates() -> None:
    h = Harness()
    await h.sched.start()
    h.add("ai0", template="ai-provider")
    h.add("ai1", template="ai-provider")
    await h.settle()
    h.add("urgent-ai", template="ai-provider", priority=1)
    h.add("idle-code", template="code-executor", priority=5)
    await h.settle()
    assert h.state("urgent-ai") == "queued"
    assert h.state("idle-code") == "running"
    assert h.running() == {"ai0", "ai1", "idle-code"}
    h.release("ai0")
    await h.settle()
    assert h.state("urgent-ai") == "running"
    await h.finish_all()
    await h.sched.close()


# -- dependencies ----------------------------------------------------------------------


@async_test
async def test_dependency_waits_then_runs() -> None:
    h = Harness()
    await h.sched.start()
    h.add("a")
    h.add("b", hold=False, deps=("a",))
    await h.settle()
    assert h.state("b") == "waiting_dependency"
    assert h.started == ["a"]
    h.release("a")
    assert await h.sched.result("b") == "b-value"
    assert h.started == ["a", "b"]
    h.add("c", hold=False, deps=("a", "b"))  # dependencies already completed
    assert h.state("c") == "queued"
    assert await h.sched.result("c") == "c-value"
    await h.sched.close()


@async_test
async def test_submit_refuses_unknown_or_later_dependencies_and_duplicate_ids() -> None:
    h = Harness()
    with pytest.raises(SchedulerError, match=r"unknown task.*later"):
        h.add("first", deps=("later",))  # dependencies must exist: no cycles possible
    with pytest.raises(SchedulerError):
        h.sched.get("first")  # nothing was registered
    h.add("later")
    h.add("first", deps=("later",))
    with pytest.raises(SchedulerError, match="already taken"):
        h.add("later")
    with pytest.raises(SchedulerError):
        h.sched.cancel("nope")
    await h.sched.close()


@async_test
async def test_failure_propagates_transitively_with_reason() -> None:
    h = Harness()
    boom = ValueError("boom")
    h.add("a", error=boom, hold=False)
    h.add("b", deps=("a",))
    h.add("c", deps=("b",))
    h.add("other")
    h.add("d", deps=("c", "other"))
    h.add("free", hold=False)
    await h.sched.start()
    assert await error_of(h.sched, "a") is boom
    await h.settle()
    for task_id, dep in [("b", "a"), ("c", "b"), ("d", "c")]:
        error = await error_of(h.sched, task_id)
        assert isinstance(error, DependencyFailed)
        assert error.what == f"dependency failed: {dep}"
        assert h.state(task_id) == "failed"
        assert h.sched.get(task_id).reason == f"dependency failed: {dep}"
    b_error = await error_of(h.sched, "b")
    assert isinstance(b_error, DependencyFailed) and "boom" in b_error.why
    assert await h.sched.result("free") == "free-value"
    assert set(h.started) == {"a", "other", "free"}
    # a task submitted after its dependency failed fails at once
    h.add("late", deps=("a",))
    assert h.state("late") == "failed"
    assert (await error_of(h.sched, "late")).what == "dependency failed: a"  # type: ignore[attr-defined]
    await h.finish_all()
    await h.sched.close()


# -- cancel ----------------------------------------------------------------------------


@async_test
async def test_cancel_queued_running_and_waiting_tasks() -> None:
    h = Harness(Limits(global_max=1))
    await h.sched.start()
    h.add("run")
    h.add("queued")
    h.add("child", deps=("queued",))
    h.add("next", hold=False)
    await h.settle()
    assert h.sched.cancel("queued") is True
    assert h.state("queued") == "cancelled"
    assert isinstance(await error_of(h.sched, "queued"), TaskCancelled)
    child = await error_of(h.sched, "child")
    assert isinstance(child, DependencyFailed) and child.what == "dependency failed: queued"
    assert "cancelled" in child.why

    assert h.sched.cancel("run") is True
    assert isinstance(await error_of(h.sched, "run"), TaskCancelled)
    assert "run" in h.cancelled  # its coroutine was cancelled
    assert await h.sched.result("next") == "next-value"  # the slot was freed
    assert "queued" not in h.started
    assert h.sched.cancel("run") is False  # already ended
    await h.sched.close()


# -- accepting_work --------------------------------------------------------------------


@async_test
async def test_not_accepting_work_holds_new_starts() -> None:
    accepting = {"ok": True}
    h = Harness(accepting_work=lambda: accepting["ok"])
    await h.sched.start()
    h.add("running")
    await h.settle()
    accepting["ok"] = False
    h.add("new", hold=False)
    await h.settle()
    assert h.state("new") == "queued"
    assert h.sched.stats().accepting_work is False
    h.release("running")
    assert await h.sched.result("running") == "running-value"  # running tasks continue
    await h.settle()
    assert h.state("new") == "queued"
    accepting["ok"] = True
    h.sched.wake()
    assert await h.sched.result("new") == "new-value"
    await h.sched.close()


@async_test
async def test_held_starts_are_rechecked_without_a_wake() -> None:
    accepting = {"ok": False}
    h = Harness(accepting_work=lambda: accepting["ok"], clock=time.monotonic, recheck_s=0.02)
    await h.sched.start()
    h.add("new", hold=False)
    await h.settle()
    assert h.state("new") == "queued"
    accepting["ok"] = True
    assert await h.sched.result("new") == "new-value"
    await h.sched.close()


# -- preemption ------------------------------------------------------------------------


@async_test
async def test_pause_then_resume_before_lower_priority_work() -> None:
    preemptor = FakePreemptor()
    h = Harness(Limits(global_max=1), preemptor=preemptor, memory_usage=lambda: 0.1)
    await h.sched.start()
    h.add("low", priority=4, max_duration_s=100.0)
    await h.settle()
    await h.tick(10.0)
    h.add("high", priority=1)
    await h.settle()
    assert preemptor.calls == [("pause", "low")]
    assert h.state("low") == "paused" and h.state("high") == "running"
    assert h.handles["low"].paused
    h.add("later", priority=5, hold=False)
    h.release("low")  # the paused coroutine reaches its checkpoint and blocks there
    await h.tick(500.0)  # paused time does not count toward max_duration
    assert "low:gate" in h.progress and "low:end" not in h.progress
    h.release("high")
    assert await h.sched.result("low") == "low-value"
    assert preemptor.calls == [("pause", "low"), ("resume", "low")]
    assert h.sched.get("low").elapsed_s == 10.0
    await h.finish_all()
    assert h.started == ["low", "high", "later"]
    # low resumed (and, with one slot, finished) before "later" could start
    assert h.progress.index("low:end") < h.progress.index("start:later")
    stats = h.sched.stats()
    assert (stats.paused_total, stats.resumed_total, stats.destroyed_total) == (1, 1, 0)
    await h.sched.close()


@pytest.mark.parametrize(
    ("elapsed", "memory", "expected"),
    [
        (80.0, 0.1, "pause"),  # exactly 80 % of max_duration
        (80.5, 0.1, None),  # WAIT: almost done
        (80.5, 0.95, None),  # WAIT beats DESTROY
        (10.0, 0.8, "pause"),
        (10.0, 0.81, "destroy"),
    ],
)
def test_preemption_decision_in_the_scheduler(
    elapsed: float, memory: float, expected: str | None
) -> None:
    async def main() -> None:
        preemptor = FakePreemptor()
        h = Harness(Limits(global_max=1), preemptor=preemptor, memory_usage=lambda: memory)
        await h.sched.start()
        h.add("low", priority=5, max_duration_s=100.0)
        await h.settle()
        await h.tick(elapsed)
        h.add("high", priority=2, hold=False)
        await h.settle()
        if expected is None:
            assert preemptor.calls == []
            assert h.state("low") == "running" and h.state("high") == "queued"
        else:
            assert preemptor.calls[0] == (expected, "low")
            assert h.started == ["low", "high"]
        await h.finish_all()
        await h.sched.close()

    asyncio.run(main())


@async_test
async def test_destroy_fails_the_victim_and_its_dependents() -> None:
    preemptor = FakePreemptor()
    h = Harness(Limits(global_max=1), preemptor=preemptor, memory_usage=lambda: 0.9)
    await h.sched.start()
    h.add("victim", priority=5)
    h.add("child", deps=("victim",))
    h.add("grandchild", deps=("child",))
    await h.settle()
    h.add("urgent", priority=1, hold=False)
    assert await h.sched.result("urgent") == "urgent-value"
    assert preemptor.calls == [("destroy", "victim")]
    error = await error_of(h.sched, "victim")
    assert isinstance(error, TaskCancelled) and "preempted" in error.what
    assert h.state("victim") == "failed"
    assert "victim" in h.cancelled
    for task_id, dep in [("child", "victim"), ("grandchild", "child")]:
        dep_error = await error_of(h.sched, task_id)
        assert isinstance(dep_error, DependencyFailed)
        assert dep_error.what == f"dependency failed: {dep}"
    assert h.sched.stats().destroyed_total == 1
    await h.sched.close()


@async_test
async def test_without_a_preemptor_or_equal_priority_nothing_is_preempted() -> None:
    h = Harness(Limits(global_max=1))
    await h.sched.start()
    h.add("low", priority=5)
    await h.settle()
    h.add("high", priority=1, hold=False)
    await h.settle()
    assert h.state("low") == "running" and h.state("high") == "queued"
    await h.finish_all()
    await h.sched.close()

    preemptor = FakePreemptor()
    h = Harness(Limits(global_max=1), preemptor=preemptor)
    await h.sched.start()
    h.add("first", priority=3)
    await h.settle()
    h.add("same", priority=3, hold=False)
    await h.settle()
    assert preemptor.calls == [] and h.state("same") == "queued"
    await h.finish_all()
    await h.sched.close()


@async_test
async def test_victim_comes_from_the_full_template_else_lowest_priority() -> None:
    preemptor = FakePreemptor()
    h = Harness(Limits(global_max=10), preemptor=preemptor)
    await h.sched.start()
    h.add("code5", priority=5)
    h.add("ai-old4", priority=4, template="ai-provider")
    h.add("ai-new4", priority=4, template="ai-provider")
    await h.settle()
    h.add("ai-urgent", priority=1, template="ai-provider", hold=False)
    await h.settle()
    assert preemptor.calls[0] == ("pause", "ai-new4")  # same template, newest
    await h.finish_all()
    await h.sched.close()

    preemptor = FakePreemptor()
    h = Harness(Limits(global_max=2), preemptor=preemptor)
    await h.sched.start()
    h.add("ai4", priority=4, template="ai-provider")
    h.add("code5", priority=5)
    await h.settle()
    h.add("policy1", priority=1, template="policy-sandbox", hold=False)
    await h.settle()
    assert preemptor.calls[0] == ("pause", "code5")  # only the global limit was full
    await h.finish_all()
    await h.sched.close()


@async_test
async def test_failed_pause_leaves_the_victim_running() -> None:
    preemptor = FakePreemptor()
    preemptor.fail.add("pause")
    h = Harness(Limits(global_max=1), preemptor=preemptor)
    await h.sched.start()
    h.add("low", priority=5)
    await h.settle()
    h.add("high", priority=1, hold=False)
    await h.settle()
    assert preemptor.calls == [("pause", "low")]  # tried once, not in a loop
    assert h.state("low") == "running" and not h.handles["low"].paused
    h.release("low")
    assert await h.sched.result("high") == "high-value"
    await h.sched.close()


@async_test
async def test_failed_resume_fails_the_task() -> None:
    preemptor = FakePreemptor()
    preemptor.fail.add("resume")
    h = Harness(Limits(global_max=1), preemptor=preemptor)
    await h.sched.start()
    h.add("low", priority=5)
    await h.settle()
    h.add("high", priority=1, hold=False)
    await h.sched.result("high")
    error = await error_of(h.sched, "low")
    assert isinstance(error, TaskCancelled) and "resumed" in error.what
    assert preemptor.calls == [("pause", "low"), ("resume", "low")]
    await h.sched.close()


# -- max_duration ----------------------------------------------------------------------


@async_test
async def test_max_duration_cancels_and_fails_the_task() -> None:
    h = Harness()
    await h.sched.start()
    h.add("slow", max_duration_s=10.0)
    h.add("after", deps=("slow",))
    await h.settle()
    await h.tick(5.0)
    await h.tick(4.5)
    assert h.state("slow") == "running"
    await h.tick(0.5)
    error = await error_of(h.sched, "slow")
    assert isinstance(error, TaskCancelled) and "max_duration" in error.what
    assert h.state("slow") == "failed" and "slow" in h.cancelled
    assert isinstance(await error_of(h.sched, "after"), DependencyFailed)
    assert h.sched.stats().timed_out_total == 1
    await h.sched.close()


@async_test
async def test_paused_time_does_not_count_toward_max_duration() -> None:
    preemptor = FakePreemptor()
    h = Harness(Limits(global_max=1), preemptor=preemptor)
    await h.sched.start()
    h.add("low", priority=5, max_duration_s=20.0)
    await h.settle()
    await h.tick(10.0)
    h.add("high", priority=1)
    await h.settle()
    await h.tick(100.0)
    h.release("high")
    await h.settle()
    assert h.state("low") == "running"
    await h.tick(9.0)
    assert h.state("low") == "running"
    await h.tick(1.0)
    assert h.state("low") == "failed"
    await h.sched.close()


# -- results and close -----------------------------------------------------------------


@async_test
async def test_results_and_exceptions_are_delivered() -> None:
    h = Harness()
    ok = h.add("ok", hold=False)
    bad_error = KeyError("missing")
    h.add("bad", hold=False, error=bad_error)
    await h.sched.start()
    assert await ok.result() == "ok-value"
    assert await h.sched.result("ok") == "ok-value"  # again, after the fact
    assert await error_of(h.sched, "bad") is bad_error
    assert ok.snapshot().state == "completed"
    assert h.sched.get("bad").reason == "'missing'"
    assert h.sched.stats().by_state["completed"] == 1
    with pytest.raises(SchedulerError):
        await h.sched.result("unknown")
    await h.sched.close()


def test_close_cancels_everything_and_leaves_no_tasks() -> None:
    async def main() -> None:
        preemptor = FakePreemptor()
        h = Harness(Limits(global_max=2), preemptor=preemptor)
        await h.sched.start()
        h.add("paused", priority=5)
        h.add("running", priority=3)
        await h.settle()
        h.add("urgent", priority=1)
        h.add("queued", priority=4)
        h.add("waiting", deps=("queued",))
        await h.settle()
        states = {t: h.state(t) for t in h.gates}
        assert states == {
            "paused": "paused",
            "running": "running",
            "urgent": "running",
            "queued": "queued",
            "waiting": "waiting_dependency",
        }
        await h.sched.close()
        # right after close(): no runner or loop task is left, every coroutine was cancelled
        assert asyncio.all_tasks() == {asyncio.current_task()}
        assert h.cancelled == {"paused", "running", "urgent"}
        for task_id in h.gates:
            assert h.state(task_id) == "cancelled"
            assert isinstance(await error_of(h.sched, task_id), TaskCancelled)
        with pytest.raises(SchedulerError, match="closed"):
            h.add("after-close")
        await h.sched.close()  # idempotent

    asyncio.run(main())
    gc.collect()


def test_close_before_start_creates_no_coroutines() -> None:
    async def main() -> None:
        h = Harness()
        h.add("a", hold=False)
        h.add("b", deps=("a",))
        await h.sched.close()
        assert h.started == []
        assert isinstance(await error_of(h.sched, "b"), TaskCancelled)
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())
    gc.collect()


# -- property: random task sets --------------------------------------------------------


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(2, 14))
    # a few templates at a time, so limits fill up and preemption happens
    templates = draw(st.lists(st.sampled_from([*TEMPLATES, "custom"]), min_size=1, max_size=3))
    tasks = []
    for i in range(n):
        tasks.append(
            {
                "id": f"t{i}",
                "template": draw(st.sampled_from(templates)),
                "priority": draw(st.integers(1, 5)),
                "deps": tuple(
                    f"t{d}"
                    for d in draw(
                        st.sets(st.integers(0, i - 1), max_size=2) if i else st.just(set())
                    )
                ),
                "steps": draw(st.integers(2, 8)),
                "fails": draw(st.integers(0, 5)) == 0,
                "cancel": draw(st.integers(0, 7)) == 0,
            }
        )
    return {
        "tasks": tasks,
        "late_from": draw(st.integers(1, n - 1)),  # these arrive once the first ones run
        "limits": Limits(
            global_max=draw(st.integers(1, 4)),
            per_template={t: draw(st.integers(1, 2)) for t in TEMPLATES},
            default_per_template=draw(st.integers(1, 2)),
        ),
        "memory": draw(st.sampled_from([None, 0.1, 0.9])),  # None: no preemptor
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_workloads_respect_limits_and_all_end(work: dict[str, Any]) -> None:
    limits: Limits = work["limits"]
    active: dict[str, str] = {}  # task id -> template, for tasks holding a slot
    violations: list[str] = []
    completed: set[str] = set()

    def enter(task_id: str, template: str) -> None:
        active[task_id] = template
        per = sum(1 for t in active.values() if t == template)
        if len(active) > limits.global_max or per > limits.for_template(template):
            violations.append(f"{task_id}: {len(active)} active, {per} in {template}")

    class CountingPreemptor:
        async def pause(self, task: Task[Any]) -> None:
            active.pop(task.id, None)
            await asyncio.sleep(0)

        async def resume(self, task: Task[Any]) -> None:
            enter(task.id, task.sandbox_template)

        async def destroy(self, task: Task[Any]) -> None:
            active.pop(task.id, None)

    def body(spec: dict[str, Any]) -> Callable[[TaskHandle], Coroutine[Any, Any, str]]:
        async def run(handle: TaskHandle) -> str:
            if not all(d in completed for d in spec["deps"]):
                violations.append(f"{spec['id']} started before its dependencies completed")
            enter(spec["id"], spec["template"])
            try:
                for _ in range(spec["steps"]):
                    await handle.checkpoint()
                    await asyncio.sleep(0)
                await handle.checkpoint()
                if spec["fails"]:
                    raise ValueError(spec["id"])
                completed.add(spec["id"])
                return spec["id"]
            finally:
                active.pop(spec["id"], None)

        return run

    async def main() -> None:
        memory = work["memory"]
        sched = Scheduler(
            limits,
            preemptor=None if memory is None else CountingPreemptor(),
            memory_usage=lambda: memory or 0.0,
        )
        specs = work["tasks"]

        def submit(spec: dict[str, Any]) -> None:
            task = Task(
                spec["id"],
                "tool_call",
                spec["template"],
                body(spec),
                priority=spec["priority"],
                dependencies=spec["deps"],
            )
            sched.submit(task)

        await sched.start()
        cut = work["late_from"]  # index order: dependencies are always submitted first
        for spec in specs[:cut]:
            submit(spec)
        await asyncio.sleep(0)
        for spec in specs[cut:]:
            submit(spec)
        await asyncio.sleep(0)
        cancelled: dict[str, bool] = {}
        for spec in specs:
            if spec["cancel"]:
                was_live = sched.get(spec["id"]).state not in ("completed", "failed", "cancelled")
                cancelled[spec["id"]] = sched.cancel(spec["id"])
                assert cancelled[spec["id"]] == was_live
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(sched.result(s["id"]) for s in specs), return_exceptions=True), 10
        )
        by_id = dict(zip([s["id"] for s in specs], outcomes, strict=True))
        for spec in specs:
            snapshot = sched.get(spec["id"])
            assert snapshot.state in ("completed", "failed", "cancelled")
            outcome = by_id[spec["id"]]
            failed_deps = [d for d in spec["deps"] if sched.get(d).state != "completed"]
            if snapshot.state == "completed":
                assert outcome == spec["id"] and not failed_deps and not spec["fails"]
            elif failed_deps and not isinstance(outcome, TaskCancelled):
                assert isinstance(outcome, DependencyFailed)
                assert outcome.what.startswith("dependency failed: ")
            if cancelled.get(spec["id"]):
                assert snapshot.state == "cancelled" and isinstance(outcome, TaskCancelled)
        assert violations == []
        assert active == {}
        await sched.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


@async_test
async def test_forget_drops_only_ended_tasks_nobody_waits_on() -> None:
    gate = asyncio.Event()

    async def slow(handle: object) -> str:
        await gate.wait()
        return "done"

    scheduler = Scheduler(Limits())
    await scheduler.start()
    try:
        scheduler.submit(Task("a", "tool_call", "code-executor", slow))
        scheduler.submit(Task("b", "tool_call", "code-executor", slow, dependencies=("a",)))
        assert not scheduler.forget("a")  # still running
        gate.set()
        assert await scheduler.result("a") == "done"
        assert await scheduler.result("b") == "done"
        assert scheduler.forget("a") and scheduler.forget("b")
        assert not scheduler.forget("a")
        with pytest.raises(SchedulerError):
            scheduler.get("a")
    finally:
        await scheduler.close()
