"""Third-party plugins' calls carry the ``third_party`` tag (design: Capability Tag).

The tool router builds a plugin call's policy caller as (plugin, {"ai", "core_plugin"}),
which is right for the built-ins only.  :class:`TaggedPolicy` is the policy front the
router is given: for a caller that is an active third-party plugin it replaces the tags
with ``{"ai", "third_party", ...}`` (``core_plugin`` and ``trusted_write`` dropped), so
policy rules written for third-party plugins apply and built-in trust is never lent.
Everything else (the engine, swaps on policy updates, auditing) is the wrapped front's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Final

import msgspec

from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.policy.audited import AuditedPolicy
from fluffy.kernel.policy.engine import Decision, PolicyEngine, Request

KERNEL_GIVEN: Final = frozenset({"core_plugin", "trusted_write"})


class TaggedPolicy(AuditedPolicy):
    def __init__(self, front: AuditedPolicy, third_party: Callable[[], Collection[str]]) -> None:
        self.front = front
        self.third_party = third_party

    @property
    def engine(self) -> PolicyEngine:
        return self.front.engine

    @engine.setter
    def engine(self, engine: PolicyEngine) -> None:
        self.front.engine = engine

    @property
    def audit(self) -> AuditLog | None:
        return self.front.audit

    @audit.setter
    def audit(self, audit: AuditLog | None) -> None:
        self.front.audit = audit

    def swap(self, engine: PolicyEngine) -> None:
        self.front.swap(engine)

    def as_evaluated(self, request: Request) -> Request:
        caller = request.caller
        if caller.name in self.third_party():
            tags = (caller.tags - KERNEL_GIVEN) | {"third_party"}
            request = msgspec.structs.replace(
                request, caller=msgspec.structs.replace(caller, tags=frozenset(tags))
            )
        return request

    def evaluate(self, request: Request) -> Decision:
        return self.front.evaluate(self.as_evaluated(request))
