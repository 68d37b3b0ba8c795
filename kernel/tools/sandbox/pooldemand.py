"""How many sandboxes of a recipe the warm pool should hold: the session's recent calls.

A recipe's :class:`Demand` keeps the times of its calls in the last minute (all of
them, and those the pool was not ready for) and what a batch announced; the pool takes
the largest of: the longest run of calls that came faster than sandboxes are made, one
more than the calls it was not ready for, and the announcement (ADR-065).
"""

from __future__ import annotations

from collections import deque

import msgspec

#: How far back demand is counted.
WINDOW_S = 60.0
#: Calls that come faster than sandboxes are made form one run (a turn's calls in a
#: row): each within the time a recent sandbox took to make (this until one was made).
MAKE_S = 0.25


class Demand(msgspec.Struct):
    misses: deque[float] = msgspec.field(default_factory=deque)
    calls: deque[float] = msgspec.field(default_factory=deque)  # every take, hit or miss
    expected: int = 0  # what the last expect() announced ...
    expected_at: float = 0.0  # ... and when
    last: float = 0.0
    failed_until: float = 0.0
    failures: int = 0

    def forget(self, now: float) -> None:
        for times in (self.misses, self.calls):
            while times and now - times[0] > WINDOW_S:
                times.popleft()

    def longest_run(self, gap: float) -> int:
        """The most calls in a row (each within ``gap`` of the one before)."""
        best = run = 0
        previous = None
        for at in self.calls:
            run = run + 1 if previous is not None and at - previous < gap else 1
            best, previous = max(best, run), at
        return best

    def wanted(self, now: float, make_s: float) -> int:
        """Idle sandboxes this recipe should have (before the pool's capacity)."""
        self.forget(now)
        announced = self.expected if now - self.expected_at <= WINDOW_S else 1
        return max(1 + len(self.misses), self.longest_run(make_s), announced)
