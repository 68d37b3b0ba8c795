"""``policy.get`` and ``policy.update`` on the kernel's IPC (design: Meta-Policy).

``policy.update`` never writes on its own say: the new text is validated in memory
(errors name file, line and field; nothing is written), tried on the last 100 decisions
the audit log recorded, and the changes come back as a plan.  Only the user (the CLI's
socket) can approve it (``approve: true``; more than five breaking changes need the
confirmation phrase).  Applying writes the file atomically, swaps the engine the kernel
uses, and records ``policy_update`` synchronously before answering.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fluffy.errors import InvalidPayload, PolicyError
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.ipc.server import CallContext, Handler
from fluffy.kernel.policy.audited import AuditedPolicy, recent_requests
from fluffy.kernel.policy.engine import Caller, Request
from fluffy.kernel.policy.meta import CONFIRM_PHRASE, TRIAL_SIZE, apply_update, plan_update
from fluffy.kernel.policy.model import PolicyFile

Reloaded = Callable[[PolicyFile], None]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def policy_methods(
    front: AuditedPolicy,
    policy_path: Path | None,
    state_dir: Path,
    audit: AuditLog,
    on_reload: Reloaded | None = None,
    default_text: str | None = None,
) -> dict[str, Handler]:
    """``default_text``: the defaults the kernel applies while the file does not exist."""

    def current_text() -> str:
        if policy_path is not None and policy_path.is_file():
            return policy_path.read_text(encoding="utf-8")
        return default_text or ""

    async def get(context: CallContext, params: Any) -> dict[str, Any]:
        if params not in (None, {}):
            raise InvalidPayload("policy.get takes no parameters")
        is_file = policy_path is not None and policy_path.is_file()
        return {
            "path": str(policy_path) if policy_path else None,
            "text": current_text(),
            "default": not is_file and default_text is not None,
        }

    async def update(context: CallContext, params: Any) -> dict[str, Any]:
        if not isinstance(params, dict) or not isinstance(params.get("text"), str):
            raise InvalidPayload("policy.update needs {text: str, approve?: bool, phrase?: str}")
        unknown = set(params) - {"text", "approve", "phrase"}
        if unknown:
            raise InvalidPayload(f"policy.update: unknown parameters {', '.join(sorted(unknown))}")
        if policy_path is None:
            raise PolicyError(
                "this kernel has no project, so no policy file to change",
                fix="Start the kernel with --project.",
            )
        is_user = context.binding == "cli"
        caller = Caller("user") if is_user else Caller(context.plugin_name or "plugin")
        decision = front.evaluate(Request("policy.update", caller))
        await audit.flush()  # the trial reads what the log holds
        history = recent_requests(state_dir, TRIAL_SIZE)
        plan = plan_update(front.engine, params["text"], history, source=str(policy_path))
        answer: dict[str, Any] = {
            "applied": False,
            "changes": [change.line() for change in plan.changes],
            "breaking": plan.breaking,
            "needs_phrase": plan.needs_phrase,
            "phrase": CONFIRM_PHRASE if plan.needs_phrase else None,
            "trial_size": plan.tried,
            # the decisions made for the model's tool calls: what the change does to it
            "ai_trial_size": plan.ai_tried,
            "ai_changes": plan.ai_changed,
        }
        if not params.get("approve"):
            return answer
        if decision.result == "deny" or not is_user:
            raise PolicyError(
                "the policy update was not approved by the user",
                why="policy.update always requires human review, given on the CLI",
            )
        if plan.needs_phrase and params.get("phrase") != CONFIRM_PHRASE:
            raise PolicyError(
                f"{plan.breaking} breaking changes need the confirmation phrase",
                fix=f'Send the phrase exactly: "{CONFIRM_PHRASE}".',
            )
        before = current_text()
        event = Event(
            "policy_update",
            caller="user",
            policy_decision="review_required",
            policy_rule_name=decision.decided_by or "builtin:meta-policy",
            input_summary=f"policy updated: {len(plan.changes)} changed decisions, "
            f"{plan.breaking} breaking",
            metadata={
                "path": str(policy_path),
                "old_sha256": _digest(before),
                "new_sha256": _digest(plan.text),
                "changes": str(len(plan.changes)),
                "breaking": str(plan.breaking),
            },
        )
        await audit.record(event)  # on record before anything changes (raises: nothing done)
        apply_update(policy_path, plan, reviewed=True, phrase=params.get("phrase"))
        front.swap(plan.engine)
        if on_reload is not None:
            on_reload(plan.policy)
        answer["applied"] = True
        return answer

    return {"policy.get": get, "policy.update": update}
