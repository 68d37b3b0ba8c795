"""``policy.get`` and ``policy.update`` on the kernel's IPC (design: Meta-Policy).

``policy.update`` never writes on its own say: the new text is validated in memory
(errors name file, line and field; nothing is written), tried on the last 100 decisions
the audit log recorded, and the changes come back as a plan.  Only the user (the CLI's
socket) can approve it (``approve: true``; more than five breaking changes need the
confirmation phrase).  Applying writes the file atomically, swaps the engine the kernel
uses, and records ``policy_update`` synchronously before answering.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import InvalidPayload, PolicyError
from fluffy.ipc.results.admin import PolicyUpdated, PolicyView
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.syscalls import NoParams, Syscall, SyscallTable
from fluffy.kernel.policy.audited import AuditedPolicy, recent_requests
from fluffy.kernel.policy.engine import Caller, Request
from fluffy.kernel.policy.extensions import ExtensionHost
from fluffy.kernel.policy.meta import (
    CONFIRM_PHRASE,
    TRIAL_SIZE,
    UpdatePlan,
    apply_update,
    plan_update,
)
from fluffy.kernel.policy.model import PolicyFile
from fluffy.kernel.policy.rules import ProjectRules, check_changes
from fluffy.kernel.tasks import to_the_end

Reloaded = Callable[[PolicyFile], None]


class UpdateParams(msgspec.Struct, forbid_unknown_fields=True):
    """``text`` and/or ``rules``; ``approve`` applies the plan (the user's CLI only)."""

    text: str | None = None
    #: the project's rules to change: name -> new text (None: remove the rule)
    rules: dict[str, str | None] | None = None
    approve: bool = False
    phrase: str | None = None


async def _shielded_start(rules: ProjectRules, after: dict[str, str]) -> ExtensionHost | None:
    """Start a candidate policy sandbox; if the caller hangs up meanwhile, the sandbox
    being started is stopped once it is up (never left running)."""
    starting = asyncio.ensure_future(asyncio.to_thread(rules.candidate, after))
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        starting.add_done_callback(_discard_started)
        raise


def _discard_started(starting: asyncio.Future[ExtensionHost | None]) -> None:
    if starting.cancelled() or starting.exception() is not None:
        return
    host = starting.result()
    if host is not None:  # stopping blocks: not on the event loop
        threading.Thread(target=ProjectRules.discard, args=(host,), daemon=True).start()


def _read_rules(rules: ProjectRules | None) -> tuple[dict[str, str], str | None]:
    """The rules on disk, and why they cannot be read ({} then: the kernel denies
    what they would judge meanwhile)."""
    try:
        return (rules.current() if rules is not None else {}), None
    except PolicyError as exc:
        return {}, f"{exc.what} ({exc.why})" if exc.why else exc.what


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def policy_methods(
    front: AuditedPolicy,
    policy_path: Path | None,
    state_dir: Path,
    audit: AuditLog,
    on_reload: Reloaded | None = None,
    default_text: str | None = None,
    rules: ProjectRules | None = None,
) -> SyscallTable:
    """``default_text``: the defaults the kernel applies while the file does not exist;
    ``rules``: the project's extension rules (``policy.update`` may change them too)."""

    def current_text() -> str:
        if policy_path is not None and policy_path.is_file():
            return policy_path.read_text(encoding="utf-8")
        return default_text or ""

    lock = asyncio.Lock()

    async def get(context: CallContext, params: NoParams) -> dict[str, Any]:
        is_file = policy_path is not None and policy_path.is_file()
        found, unreadable = _read_rules(rules)
        return {
            "path": str(policy_path) if policy_path else None,
            "text": current_text(),
            "default": not is_file and default_text is not None,
            "rules": found,
            "rules_error": unreadable,
        }

    async def update(context: CallContext, params: UpdateParams) -> dict[str, Any]:
        if params.text is None and params.rules is None:
            raise InvalidPayload(
                "policy.update needs {text?: str, rules?: {name: text|null}, approve?: bool, "
                "phrase?: str} with text or rules"
            )
        if policy_path is None:
            raise PolicyError(
                "this kernel has no project, so no policy file to change",
                fix="Start the kernel with --project.",
                why="a kernel started without --project serves no policy file",
            )
        changes = params.rules
        if changes is not None and rules is None:
            raise PolicyError(
                "this kernel has no project rules folder to change",
                why="extension rules live in the project's .fluffy/rules/, and this kernel has "
                "none",
                fix="Start the kernel with --project to change the project's rules.",
            )
        async with lock:  # one update at a time: each is planned on what is in force
            return await _update(context, params, changes)

    async def _update(
        context: CallContext, params: UpdateParams, changes: dict[str, str | None] | None
    ) -> dict[str, Any]:
        assert policy_path is not None
        text = params.text if params.text is not None else current_text()
        is_user = context.binding == "cli"
        caller = Caller("user") if is_user else Caller(context.plugin_name or "plugin")
        decision = front.evaluate(Request("policy.update", caller))
        after = check_changes(rules.current(), changes) if changes is not None and rules else None
        candidate: ExtensionHost | None = None
        applying: asyncio.Future[None] | None = None
        try:
            if after is not None and rules is not None:  # the new set runs before it is tried
                candidate = await _shielded_start(rules, after)
            await audit.flush()  # the trial reads what the log holds
            history = recent_requests(state_dir, TRIAL_SIZE)
            plan = plan_update(
                front.engine,
                text,
                history,
                source=str(policy_path),
                extensions=None if after is None else ([candidate] if candidate else []),
            )
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
                "rules": sorted(after) if after is not None else None,
            }
            if not params.approve:
                return answer
            if decision.result == "deny" or not is_user:
                raise PolicyError(
                    "the policy update was not approved by the user",
                    why="policy.update always requires human review, given on the CLI",
                )
            if plan.needs_phrase and params.phrase != CONFIRM_PHRASE:
                raise PolicyError(
                    f"{plan.breaking} breaking changes need the confirmation phrase",
                    fix=f'Send the phrase exactly: "{CONFIRM_PHRASE}".',
                    why="an update that removes or weakens rules must be confirmed on purpose",
                )
            # once started, applying finishes even if the caller hangs up: half an
            # update (files written, engine not swapped) would be a policy not in force
            applying = asyncio.ensure_future(
                _apply(plan, params, text, changes, after, candidate, decision.decided_by)
            )
            await to_the_end(applying)
            answer["applied"] = True
            return answer
        finally:
            settled = applying is None or applying.done()  # else: it may still install it
            if (
                candidate is not None
                and settled
                and rules is not None
                and rules.host is not candidate
            ):
                await asyncio.to_thread(ProjectRules.discard, candidate)

    async def _apply(
        plan: UpdatePlan,
        params: UpdateParams,
        text: str,
        changes: dict[str, str | None] | None,
        after: dict[str, str] | None,
        candidate: ExtensionHost | None,
        decided_by: str | None,
    ) -> None:
        assert policy_path is not None
        before = current_text()
        metadata = {
            "path": str(policy_path),
            "old_sha256": _digest(before),
            "new_sha256": _digest(plan.text),
            "changes": str(len(plan.changes)),
            "breaking": str(plan.breaking),
        }
        if changes is not None:
            metadata["rules_changed"] = ",".join(sorted(changes))
            metadata["rules_sha256"] = _digest(
                "\0".join(f"{name}\0{body}" for name, body in sorted((after or {}).items()))
            )
        event = Event(
            "policy_update",
            caller="user",
            policy_decision="review_required",
            policy_rule_name=decided_by or "builtin:meta-policy",
            input_summary=f"policy updated: {len(plan.changes)} changed decisions, "
            f"{plan.breaking} breaking"
            + (f"; rules changed: {', '.join(sorted(changes))}" if changes else ""),
            metadata=metadata,
        )
        await audit.record(event)  # on record before anything changes (raises: nothing done)
        if params.text is not None and (text != before or not policy_path.is_file()):
            apply_update(policy_path, plan, reviewed=True, phrase=params.phrase)
        if changes is not None and rules is not None:
            await asyncio.to_thread(rules.install, changes, candidate)
        front.swap(plan.engine)
        if on_reload is not None:
            on_reload(plan.policy)

    return SyscallTable(
        [
            Syscall("policy.get", NoParams, get, PolicyView, since=1),
            # any caller may ask for a plan; only the user's CLI applies one (checked in
            # the handler, after the plan: a plugin's attempt is judged and audited)
            Syscall("policy.update", UpdateParams, update, PolicyUpdated, since=1),
        ]
    )
