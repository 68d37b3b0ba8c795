"""Each session's event stream for the CLI (``session.events`` long-polls it).

The session loop emits typed events (fluffy/ipc/results/events.py); the stream numbers
them (``seq``) and keeps them as they are: a long-poll's answer encodes them directly.
"""

from __future__ import annotations

import asyncio
from collections import deque

import msgspec

from fluffy.ipc.results.events import SessionEvent

#: Events kept per session (older ones are dropped; a CLI that fell behind sees a gap).
KEEP = 5000


class EventStream:
    def __init__(self) -> None:
        self.events: deque[SessionEvent] = deque(maxlen=KEEP)
        self.seq = 0
        self.changed = asyncio.Condition()

    async def emit(self, event: SessionEvent) -> SessionEvent:
        """``event``, numbered next in the stream, for every waiting reader."""
        self.seq += 1
        stamped = msgspec.structs.replace(event, seq=self.seq)
        self.events.append(stamped)
        async with self.changed:
            self.changed.notify_all()
        return stamped

    def trim(self, keep: int = 200) -> None:
        """Keep only the newest ``keep`` events (a finished turn's stream need not stay
        whole; sequence numbers go on, so a CLI's cursor stays valid)."""
        while len(self.events) > keep:
            self.events.popleft()

    def after(self, seq: int, limit: int = 500) -> list[SessionEvent]:
        return [e for e in self.events if e.seq > seq][:limit]

    async def wait(self, seq: int, timeout_s: float) -> list[SessionEvent]:
        found = self.after(seq)
        if found or timeout_s <= 0:
            return found
        async with self.changed:
            try:
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: self.seq > seq), timeout=timeout_s
                )
            except TimeoutError:
                return []
        return self.after(seq)
