"""The scheduler's ready queue: a min-heap by effective priority, FIFO within a priority.

Entries are tasks that could run now but for a free slot: ``queued`` tasks and ``paused``
ones (preempted, waiting to resume).  Starvation prevention: an entry that has waited
``k`` whole ``age_threshold_s`` periods runs at ``priority - k``, never better than
priority 2; priority-1 entries are never bumped, so bumped entries never outrank them.

Keys only change at bump instants, so the heap is re-keyed lazily: when the clock passes
the earliest pending bump, every key is recomputed and the heap rebuilt.  The scheduler
sleeps until :meth:`ReadyQueue.next_bump_at` instead of polling.  Order within one
effective priority: paused entries first (they already hold a sandbox), then submission
order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

import msgspec

from fluffy.errors import SchedulerError
from fluffy.kernel.scheduler.task import BUMP_CEILING, PRIORITY_SYSTEM

Key = tuple[int, int, int]  # (effective priority, 0 paused / 1 queued, submit sequence)


class Entry(msgspec.Struct, frozen=True):
    task_id: str
    priority: int  # the priority aging starts from
    seq: int  # submission order (FIFO tie-break)
    since: float  # when it started waiting (clock seconds)
    paused: bool = False
    ages: bool = True  # False: starvation prevention never bumps it (yielding work)


def _bumps(since: float, now: float, threshold: float) -> int:
    """Whole thresholds elapsed since ``since``: the largest k with since + k*t <= now."""
    if now <= since:
        return 0
    k = int((now - since) // threshold)
    while since + (k + 1) * threshold <= now:
        k += 1
    while k > 0 and since + k * threshold > now:
        k -= 1
    return k


def effective_priority(priority: int, since: float, now: float, threshold: float) -> int:
    """``priority`` bumped one level per whole ``threshold`` waited, capped at priority 2."""
    if priority <= BUMP_CEILING:
        return priority
    return max(BUMP_CEILING, priority - _bumps(since, now, threshold))


def next_bump(priority: int, since: float, now: float, threshold: float) -> float | None:
    """When the entry's effective priority next improves (None: it never will again)."""
    if effective_priority(priority, since, now, threshold) <= BUMP_CEILING:
        return None
    return since + (_bumps(since, now, threshold) + 1) * threshold


class ReadyQueue:
    def __init__(self, age_threshold_s: float) -> None:
        if not age_threshold_s > 0:
            raise SchedulerError(
                f"age_threshold_s must be positive, got {age_threshold_s!r}",
                fix="Set scheduler.age_threshold to a positive duration, e.g. 30s.",
                why="aging raises a waiting task's priority once per threshold, so it must be a "
                "positive time",
            )
        self.threshold = age_threshold_s
        self._entries: dict[str, Entry] = {}
        self._keys: dict[str, Key] = {}
        self._heap: list[tuple[Key, str]] = []
        self._rekey_at = math.inf

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._entries

    def get(self, task_id: str) -> Entry | None:
        return self._entries.get(task_id)

    def _effective(self, entry: Entry, now: float) -> int:
        if not entry.ages:
            return entry.priority
        return effective_priority(entry.priority, entry.since, now, self.threshold)

    def _bump(self, entry: Entry, now: float) -> float | None:
        if not entry.ages:
            return None
        return next_bump(entry.priority, entry.since, now, self.threshold)

    def _key(self, entry: Entry, now: float) -> Key:
        return (self._effective(entry, now), 1 - int(entry.paused), entry.seq)

    def push(self, entry: Entry) -> None:
        if entry.task_id in self._entries:
            raise SchedulerError(
                f"task {entry.task_id} is already in the ready queue",
                why="a task is queued once; queueing it again is a scheduler bug",
                fix="Report it with the kernel's log; the task keeps its first place.",
            )
        if entry.priority < PRIORITY_SYSTEM:
            raise SchedulerError(
                f"task {entry.task_id}: priority {entry.priority} is below 1",
                why="priorities start at 1 (system)",
                fix="Give the task a priority of 1 or more.",
            )
        key = self._key(entry, entry.since)
        self._entries[entry.task_id] = entry
        self._keys[entry.task_id] = key
        heapq.heappush(self._heap, (key, entry.task_id))
        bump = self._bump(entry, entry.since)
        if bump is not None:
            self._rekey_at = min(self._rekey_at, bump)

    def remove(self, task_id: str) -> Entry | None:
        entry = self._entries.pop(task_id, None)
        self._keys.pop(task_id, None)
        if not self._entries:
            self._heap.clear()
            self._rekey_at = math.inf
        elif len(self._heap) > 2 * len(self._entries) + 16:
            self._heap = [(k, i) for i, k in self._keys.items()]
            heapq.heapify(self._heap)
        return entry

    def _rekey(self, now: float) -> None:
        if now < self._rekey_at:
            return
        self._rekey_at = math.inf
        for task_id, entry in self._entries.items():
            self._keys[task_id] = self._key(entry, now)
            bump = self._bump(entry, now)
            if bump is not None:
                self._rekey_at = min(self._rekey_at, bump)
        self._heap = [(k, i) for i, k in self._keys.items()]
        heapq.heapify(self._heap)

    def effective(self, task_id: str, now: float) -> int:
        return self._effective(self._entries[task_id], now)

    def ordered(self, now: float) -> Iterator[tuple[int, Entry]]:
        """(effective priority, entry), best first; lazy, on a copy of the heap."""
        self._rekey(now)
        heap = list(self._heap)
        while heap:
            key, task_id = heapq.heappop(heap)
            if self._keys.get(task_id) == key:
                yield key[0], self._entries[task_id]

    def next_bump_at(self, now: float) -> float | None:
        """The earliest instant after ``now`` an entry's priority changes (None: never)."""
        self._rekey(now)
        return None if math.isinf(self._rekey_at) else self._rekey_at
