"""What a plugin's sandbox returns, checked and staged; a prepared commit, applied.

A write tool's sandbox returns a change list: each change must be to a path the call
was authorised for and be one use of the call's capability token (ADR-041), and the
session must still be in the state the call was allowed in; only then is it ingested
into the session's staging area (the project changes at the merge in ``reviewing``).
``git.commit``'s prepared commit is merged into the repository by the merger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fluffy.errors import MergeConflict, MergeRefused, ToolFailed, ToolUnavailable
from fluffy.kernel.merge.identity import (
    DEFAULT_TRAILER,
    FALLBACK,
    clean,
    repo_identity,
    with_trailer,
)
from fluffy.kernel.merge.ingest import ingest
from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.merge.staging import StagedChange
from fluffy.kernel.policy.audited import AuditedPolicy
from fluffy.kernel.policy.engine import Caller, Request
from fluffy.kernel.policy.tokens import TokenUse
from fluffy.kernel.tasks import to_the_end
from fluffy.kernel.tools.changes.flow import Flow
from fluffy.kernel.tools.changes.workspace import Workspaces
from fluffy.kernel.tools.core.capabilities import token_ref
from fluffy.kernel.tools.core.routedcall import RoutedCall
from fluffy.kernel.tools.sandbox.pluginjob import PluginOutcome
from fluffy.kernel.tools.sandbox.plugins import PluginRunner
from fluffy.kernel.workflow.machine import Workflow


async def stage(
    call: RoutedCall,
    outcome: PluginOutcome,
    *,
    runner: PluginRunner | None,
    policy: AuditedPolicy,
    flow: Flow,
    workflow: Workflow,
    workspaces: Workspaces,
    protected: list[str],
    available: Callable[[str], Awaitable[list[str]]],
) -> dict[str, Any]:
    """Stage a write call's changes (``available``: the tools a session has now)."""
    changes = outcome.result.get("changes")
    if not isinstance(changes, list):
        raise MergeRefused(f"{call.spec.name} returned no change list")
    for change in changes:
        path = change.get("path") if isinstance(change, dict) else None
        if path not in call.writes:
            raise MergeRefused(
                f"{call.spec.plugin} tried to change {path!r}, which this call was not "
                f"allowed to write",
                why=f"the call was authorised for {', '.join(sorted(call.writes))} only",
            )
    check_uses(call, outcome, changes, runner=runner, policy=policy)
    async with flow.lock(call.session.id):
        now = await workflow.get(call.session.id)
        if now.state != call.session.state:
            raise ToolUnavailable(
                f"{call.spec.name} finished after the session moved on to {now.state}",
                tool_name=call.spec.name,
                current_state=now.state,
                reason=f"it was allowed in {call.session.state}; nothing was staged",
                available_tools=await available(now.id),
                fix="Nothing was staged from this call; call the tool again if the new state "
                "allows it.",
            )
        stage = workspaces.get(call.session.id)

        def staged_and_diff() -> tuple[list[StagedChange], str]:  # one trip to a thread
            staged = ingest(outcome.call_dir, changes, stage, protected=protected)
            return staged, stage.diff({c.path for c in staged})  # this call's, not the session's

        # a caller that leaves waits for the thread: the area is not handed to another
        # call while this one still writes it
        staged, diff = await to_the_end(asyncio.to_thread(staged_and_diff))
    if call.review:
        reasons = list(call.session.data.review_required)
        await workflow.annotate(
            call.session.id, "review_required", review_required=[*reasons, call.review]
        )
    return {
        "staged": [c.path for c in staged],
        "note": "staged: tests and reads see it now; the project changes when the "
        "merge is approved in reviewing",
        "review_required": call.review,
        "diff": diff[-8000:],
    }


def check_uses(
    call: RoutedCall,
    outcome: PluginOutcome,
    changes: list[Any],
    *,
    runner: PluginRunner | None,
    policy: AuditedPolicy,
) -> None:
    """Each change is one use of the call's token, presented by the sandbox with a
    nonce: checked by the policy engine (token fast path, built-ins still run).  A
    change the token does not cover -- another path, a use too many, a replayed
    nonce, a token of another sandbox or connection -- is refused: nothing staged."""
    token = outcome.token
    if call.capability is None:
        return
    if token is None:
        if getattr(runner, "capabilities", None) is None:
            return  # this kernel issues no tokens (no engine: tests)
        raise MergeRefused(
            f"{call.spec.plugin} returned changes without the call's capability token",
            why="its host never took a token for this call",
            fix="Nothing was staged; call the tool again.",
        )
    spec, session = call.spec, call.session
    presented = outcome.result.get("capability")
    token_id = presented.get("token") if isinstance(presented, dict) else None
    uses = presented.get("uses") if isinstance(presented, dict) else None
    uses = uses if isinstance(uses, list) else []
    caller = Caller(
        spec.plugin or "plugin",
        frozenset({"ai", "core_plugin"}),
        token.container_id,
        outcome.connection,
    )
    used = 0
    for index, change in enumerate(changes):
        path = change.get("path") if isinstance(change, dict) else None
        use = uses[index] if index < len(uses) and isinstance(uses[index], dict) else {}
        nonce = use.get("nonce")
        shown = (
            TokenUse(token_id, nonce)
            if isinstance(token_id, str)
            and use.get("path") == path
            and isinstance(nonce, int)
            and not isinstance(nonce, bool)
            else None
        )
        decision = policy.evaluate(
            Request(
                syscall=spec.name,
                caller=caller,
                path=path if isinstance(path, str) else None,
                state=session.state,
                mode=session.mode,
                sandbox=spec.template,
                token=shown,
            )
        )
        if decision.result != "allow" or not decision.by_token:
            raise MergeRefused(
                f"{spec.plugin}'s change to {path!r} was not covered by the call's "
                "capability token",
                why="; ".join(decision.reasons)
                if decision.result == "deny" and decision.decided_by
                else "a change needs the call's token, for its own path, once, with a "
                "nonce greater than the last (none, another or a replayed one was shown)",
                fix="Nothing was staged; call the tool again.",
            )
        used += 1
    call.token = token_ref(token.token_id)
    call.token_ops = f"{used}/{token.max_ops}"


async def commit_settings(
    call: RoutedCall, workspaces: Workspaces, project: Path
) -> dict[str, Any]:
    """What git.commit commits (the session's merged, uncommitted paths), as whom, and
    the message with fluffy's trailer (kernel/merge/landed.py, identity.py)."""
    paths = await asyncio.to_thread(workspaces.landed(call.session.id).paths)
    if not paths:
        raise ToolFailed(
            "nothing to commit: this session has merged no change since its last commit",
            why="the AI's commit holds only what the session merged, never the rest of the "
            "working tree",
            fix="Make the change, run the tests, and commit after the merge.",
        )
    data = call.session.data
    given = data.commit_author
    author = clean(given.get("name"), given.get("email")) if given is not None else None
    author = author or await asyncio.to_thread(repo_identity, project) or FALLBACK
    trailer = data.commit_trailer if data.commit_trailer is not None else DEFAULT_TRAILER
    message = with_trailer(str(call.args.get("message", "")), trailer)
    return {"commit": {"paths": paths, "author": author, "message": message}}


async def commit(
    call: RoutedCall, outcome: PluginOutcome, *, merger: Merger, flow: Flow
) -> dict[str, Any]:
    """Apply ``git.commit``'s prepared commit to the repository (none when every
    merged change overlaps the person's uncommitted lines, or HEAD has them all)."""
    left_out = _texts(outcome.result.get("left_out"))
    notes = _texts(outcome.result.get("notes"))
    if outcome.result.get("commit") is None:
        steps = await flow.committed(call.session.id)
        return {
            "commit": None,
            "files": [],
            "left_out": left_out,
            "notes": notes,
            "workflow": [s.to_dict() for s in steps],
        }
    result = await asyncio.to_thread(merger.merge_git, outcome.call_dir, outcome.result)
    problems = [*result.conflicts, *result.refused]
    if result.status != "completed" or problems:
        raise MergeConflict(
            "the commit was prepared but not applied to the repository",
            why="; ".join(f"{p.path}: {p.reason}" for p in problems) or result.status,
            fix="Look at `git status` and `git log`, then call git.commit again.",
        )
    steps = await flow.committed(call.session.id)
    answer = {
        "commit": outcome.result.get("commit"),
        "ref": outcome.result.get("ref"),
        "files": outcome.result.get("files", []),
        "author": outcome.result.get("author"),
        "merged": list(getattr(result, "merged", [])),
        "workflow": [s.to_dict() for s in steps],
    }
    if left_out:
        answer["left_out"] = left_out
    notes += list(getattr(result, "notes", None) or [])
    if notes:
        answer["notes"] = notes
    return answer


def _texts(value: object, *, most: int = 1000) -> list[str]:
    """A list of short texts from the git tool's answer (anything else is dropped)."""
    if not isinstance(value, list):
        return []
    return [item[:2000] for item in value[:most] if isinstance(item, str)]
