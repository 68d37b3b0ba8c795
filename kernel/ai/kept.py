"""Values worked out from a session's messages, kept by the message's identity.

A running session's messages come back as the same objects every round (the
conversation store keeps them), and the context is rebuilt from all of them at each
round: what is worked out once per message (its tool calls' token cost, its form on the
wire) is kept here instead of being worked out again.  The message is kept with its
value, so an id is never taken for another's.  The whole cache is cleared when it holds
``limit`` messages or ``weight_limit`` of what its values weigh: what it keeps alive is
bounded, whatever the store has since let go.
"""

from __future__ import annotations

from typing import Generic, TypeVar

V = TypeVar("V")


class KeptByIdentity(Generic[V]):
    def __init__(self, limit: int, weight_limit: int) -> None:
        self.limit = limit
        self.weight_limit = weight_limit
        self.kept: dict[int, tuple[object, V]] = {}
        self.weight = 0

    def get(self, key: object) -> V | None:
        hit = self.kept.get(id(key))
        return hit[1] if hit is not None and hit[0] is key else None

    def put(self, key: object, value: V, weight: int = 0) -> V:
        if len(self.kept) >= self.limit or self.weight >= self.weight_limit:
            self.kept.clear()
            self.weight = 0
        self.kept[id(key)] = (key, value)
        self.weight += weight
        return value
