"""The meta-policy (design: Meta-Policy): how a policy itself changes.

Never through ``fs.write`` (a built-in denies it); through ``policy.update``, which is
always reviewed.  :func:`plan_update` validates the new policy in memory and replays the
last decisions against it, listing only the results that change; allow -> deny is
``[BREAKING]``; more than five breaking changes need a typed confirmation phrase.
:func:`apply_update` then writes a temporary file and renames it over the policy (atomic),
so a crash leaves either the old or the new policy, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec

from fluffy.errors import PolicyError
from fluffy.kernel.policy.audited import is_ai
from fluffy.kernel.policy.engine import ExtensionRule, PolicyEngine, Request
from fluffy.kernel.policy.model import PolicyFile, parse_policy

TRIAL_SIZE = 100
BREAKING_LIMIT = 5
CONFIRM_PHRASE = "I accept these breaking policy changes"


class Change(msgspec.Struct, frozen=True):
    request: Request
    before: str
    after: str

    @property
    def breaking(self) -> bool:
        return self.before == "allow" and self.after == "deny"

    def line(self) -> str:
        mark = "[BREAKING] " if self.breaking else ""
        what = f"{self.request.syscall} {self.request.path or ''}".strip()
        who = self.request.caller.name
        if is_ai(self.request):  # the model's call (a plugin runs it: say for whom)
            who = "the model" if who == "ai" else f"{who} for the model"
        return f"{mark}{what} by {who}: {self.before} -> {self.after}"


class UpdatePlan(msgspec.Struct):
    policy: PolicyFile
    text: str
    engine: PolicyEngine  # the engine the new policy runs in (what apply swaps in)
    changes: list[Change] = msgspec.field(default_factory=list)
    tried: int = 0  # decisions replayed
    ai_tried: int = 0  # of them, decisions made for the model's tool calls

    @property
    def ai_changed(self) -> int:
        return sum(is_ai(change.request) for change in self.changes)

    @property
    def breaking(self) -> int:
        return sum(change.breaking for change in self.changes)

    @property
    def needs_phrase(self) -> bool:
        return self.breaking > BREAKING_LIMIT


def plan_update(
    current: PolicyEngine,
    new_text: str,
    history: Sequence[Request],
    *,
    source: str = "new policy",
    extensions: Sequence[ExtensionRule] | None = None,
) -> UpdatePlan:
    """Validate ``new_text`` (raises :class:`PolicyError`) and replay the last decisions.

    ``history`` is the requests of recent audited decisions, oldest first (the last
    :data:`TRIAL_SIZE` of all and of the model's, see
    :func:`~fluffy.kernel.policy.audited.recent_requests`); tokens are left out of the
    replay (they were single-use).  ``extensions``: the new extension rules (None: the
    current ones).
    """
    policy = parse_policy(new_text, source)
    candidate = current.with_policy(policy, extensions)
    changes = []
    for request in history:
        replay = msgspec.structs.replace(request, token=None)
        before = current.evaluate(replay).result
        after = candidate.evaluate(replay).result
        if before != after:
            changes.append(Change(replay, before, after))
    return UpdatePlan(
        policy, new_text, candidate, changes, len(history), sum(is_ai(r) for r in history)
    )


def apply_update(
    path: Path, plan: UpdatePlan, *, reviewed: bool, phrase: str | None = None
) -> None:
    """Atomically replace the policy file with the planned text."""
    if not reviewed:
        raise PolicyError(
            "the policy update was not approved",
            why="policy.update always requires human review",
            fix="Review the listed changes and approve them.",
        )
    if plan.needs_phrase and phrase != CONFIRM_PHRASE:
        raise PolicyError(
            f"{plan.breaking} breaking changes (allow -> deny) need the confirmation phrase",
            why=f"more than {BREAKING_LIMIT} previously allowed operations would be denied",
            fix=f'Type exactly: "{CONFIRM_PHRASE}".',
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".policy.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(plan.text)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).chmod(0o644)
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp).unlink()
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
