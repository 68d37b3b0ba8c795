"""The scheduler's pure parts: preemption decision, victim choice, aging, the ready queue."""

from __future__ import annotations

import pytest

from fluffy.errors import SchedulerError
from fluffy.kernel.scheduler import Limits, Task, decide, effective_priority, pick_victim
from fluffy.kernel.scheduler.preempt import RunningTask
from fluffy.kernel.scheduler.queue import Entry, ReadyQueue, next_bump


async def _noop(handle: object) -> None:
    return None


# -- decide: the design's WAIT / DESTROY / PAUSE rule -----------------------------------


@pytest.mark.parametrize(
    ("elapsed", "max_duration", "memory", "expected"),
    [
        (0.0, 10.0, 0.0, "pause"),
        (8.0, 10.0, 0.5, "pause"),  # exactly 80 % of max_duration: not "past" it
        (8.001, 10.0, 0.5, "wait"),
        (9.9, 10.0, 0.99, "wait"),  # almost done wins over memory pressure
        (1.0, 10.0, 0.8, "pause"),  # exactly 80 % memory: not above it
        (1.0, 10.0, 0.801, "destroy"),
        (8.0, 10.0, 0.95, "destroy"),
        (80.0, 100.0, 0.0, "pause"),
        (80.5, 100.0, 0.0, "wait"),
    ],
)
def test_decide(elapsed: float, max_duration: float, memory: float, expected: str) -> None:
    assert decide(elapsed, max_duration, memory) == expected


# -- pick_victim -----------------------------------------------------------------------


def _running(*rows: tuple[str, str, int, int]) -> list[RunningTask]:
    return [RunningTask(*row) for row in rows]


def test_victim_is_lowest_priority_then_newest() -> None:
    running = _running(
        ("old5", "code-executor", 5, 1),
        ("p4", "code-executor", 4, 2),
        ("new5", "code-executor", 5, 3),
        ("p3", "code-executor", 3, 4),
    )
    assert pick_victim(running, priority=1, template=None).task_id == "new5"  # type: ignore[union-attr]
    assert pick_victim(running[:2], priority=1, template=None).task_id == "old5"  # type: ignore[union-attr]


def test_victim_must_be_strictly_lower_priority() -> None:
    running = _running(("a", "ai-provider", 3, 1), ("b", "ai-provider", 2, 2))
    assert pick_victim(running, priority=3, template=None) is None
    assert pick_victim(running, priority=2, template=None).task_id == "a"  # type: ignore[union-attr]


def test_victim_of_a_full_template_comes_from_that_template() -> None:
    running = _running(("code", "code-executor", 5, 2), ("ai", "ai-provider", 4, 1))
    assert pick_victim(running, priority=1, template="ai-provider").task_id == "ai"  # type: ignore[union-attr]
    assert pick_victim(running, priority=1, template=None).task_id == "code"  # type: ignore[union-attr]
    assert pick_victim(running, priority=1, template="policy-sandbox") is None


# -- aging -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "waited", "expected"),
    [
        (5, 0.0, 5),
        (5, 29.99, 5),
        (5, 30.0, 4),  # one level per whole threshold
        (5, 59.0, 4),
        (5, 60.0, 3),
        (5, 90.0, 2),
        (5, 1e9, 2),  # capped at 2
        (4, 1e9, 2),
        (3, 30.0, 2),
        (2, 1e9, 2),
        (1, 1e9, 1),  # system tasks are never bumped
    ],
)
def test_effective_priority(priority: int, waited: float, expected: int) -> None:
    assert effective_priority(priority, 100.0, 100.0 + waited, 30.0) == expected


def test_next_bump_is_the_next_whole_threshold_and_stops_at_the_cap() -> None:
    assert next_bump(5, 0.0, 0.0, 30.0) == 30.0
    assert next_bump(5, 0.0, 30.0, 30.0) == 60.0
    assert next_bump(5, 0.0, 61.0, 30.0) == 90.0
    assert next_bump(5, 0.0, 90.0, 30.0) is None  # already at 2
    assert next_bump(2, 0.0, 0.0, 30.0) is None
    assert next_bump(1, 0.0, 0.0, 30.0) is None
    # the instant returned is exactly where the bump happens (no spinning timer)
    for since in (0.1, 1000.3, 12345.678):
        at = next_bump(5, since, since, 0.7)
        assert at is not None and at > since
        assert effective_priority(5, since, at, 0.7) == 4
        assert effective_priority(5, since, at - 1e-6, 0.7) == 5


# -- the ready queue -------------------------------------------------------------------


def _order(queue: ReadyQueue, now: float) -> list[str]:
    return [entry.task_id for _, entry in queue.ordered(now)]


def test_queue_orders_by_priority_then_fifo() -> None:
    queue = ReadyQueue(30.0)
    for seq, (task_id, priority) in enumerate(
        [("c3", 3), ("a1", 1), ("e5", 5), ("b3", 3), ("d2", 2), ("f1", 1)], start=1
    ):
        queue.push(Entry(task_id, priority, seq, since=0.0))
    assert _order(queue, 0.0) == ["a1", "f1", "d2", "c3", "b3", "e5"]
    assert len(queue) == 6 and "e5" in queue


def test_queue_bumps_waiting_entries_but_never_above_system() -> None:
    queue = ReadyQueue(30.0)
    queue.push(Entry("old5", 5, 1, since=0.0))
    queue.push(Entry("new4", 4, 2, since=29.0))
    assert _order(queue, 29.0) == ["new4", "old5"]
    assert _order(queue, 30.0) == ["old5", "new4"]  # both 4 now; FIFO by submission
    queue.push(Entry("sys1", 1, 3, since=1000.0))
    queue.push(Entry("hi2", 2, 4, since=1000.0))
    assert queue.effective("old5", 1000.0) == 2
    assert _order(queue, 1000.0) == ["sys1", "old5", "new4", "hi2"]


def test_queue_next_bump_at() -> None:
    queue = ReadyQueue(30.0)
    assert queue.next_bump_at(0.0) is None
    queue.push(Entry("sys", 1, 1, since=0.0))
    assert queue.next_bump_at(0.0) is None
    queue.push(Entry("idle", 5, 2, since=10.0))
    assert queue.next_bump_at(10.0) == 40.0
    assert queue.next_bump_at(45.0) == 70.0
    assert queue.next_bump_at(100.0) is None  # reached priority 2
    queue.remove("idle")
    queue.push(Entry("low", 4, 3, since=200.0))
    assert queue.next_bump_at(200.0) == 230.0


def test_queue_paused_entries_go_first_within_a_priority() -> None:
    queue = ReadyQueue(30.0)
    queue.push(Entry("queued", 4, 1, since=0.0))
    queue.push(Entry("paused", 4, 9, since=0.0, paused=True))
    queue.push(Entry("better", 3, 10, since=0.0))
    assert _order(queue, 0.0) == ["better", "paused", "queued"]


def test_queue_remove_and_reuse() -> None:
    queue = ReadyQueue(30.0)
    for seq in range(100):
        queue.push(Entry(f"t{seq}", 3, seq, since=0.0))
    for seq in range(0, 100, 2):
        assert queue.remove(f"t{seq}") is not None
    assert queue.remove("t0") is None
    assert _order(queue, 0.0) == [f"t{seq}" for seq in range(1, 100, 2)]
    with pytest.raises(SchedulerError):
        queue.push(Entry("t1", 3, 1, since=0.0))
    with pytest.raises(SchedulerError):
        ReadyQueue(0.0)


# -- validation of the model -----------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"priority": 0},
        {"priority": 6},
        {"priority": True},
        {"type": "compile"},
        {"id": ""},
        {"sandbox_template": ""},
        {"max_duration_s": 0.0},
        {"dependencies": ("a", "a")},
    ],
)
def test_task_rejects_invalid_fields(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "id": "t",
        "type": "tool_call",
        "sandbox_template": "code-executor",
        "run": _noop,
    }
    fields.update(kwargs)
    with pytest.raises(SchedulerError):
        Task(**fields)  # type: ignore[arg-type]


def test_limits_defaults_and_validation() -> None:
    limits = Limits()
    assert limits.global_max == 4
    assert [limits.for_template(t) for t in ("ai-provider", "code-executor", "policy-sandbox")] == [
        2,
        2,
        1,
    ]
    assert limits.for_template("integration-test") == 4
    assert Limits(default_per_template=3).for_template("anything") == 3
    for bad in (
        {"global_max": 0},
        {"per_template": {"ai-provider": 0}},
        {"default_per_template": -1},
    ):
        with pytest.raises(SchedulerError):
            Limits(**bad)  # type: ignore[arg-type]
