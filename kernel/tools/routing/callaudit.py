"""A tool call's answer and its audit entries.

Each call leaves a ``tool_execute`` entry (a long call's start, and each retry) and a
``tool_result`` entry: the sanitised output, the original's size and hash, the policy
requests decided for it, its token's uses, how the user allowed it.  The answer is
always a result object -- a refusal or a failure is ``{"ok": false, "error": {...}}``.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import msgspec

from fluffy.errors import FluffyError
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.observer import summarize
from fluffy.kernel.tools.core.routedcall import RoutedCall
from fluffy.kernel.tools.reading.sanitizer import OutputSanitizer
from fluffy.kernel.workflow.machine import Workflow

_ENCODE = msgspec.json.Encoder(enc_hook=repr).encode


async def finish(
    call: RoutedCall | None,
    *,
    tool: str,
    session_id: str,
    call_id: str,
    started: float,
    retries: int,
    output: dict[str, Any] | FluffyError,
    asked: list[dict[str, Any]],
    args: Any,
    sanitizer: OutputSanitizer,
    workflow: Workflow,
    audit: AuditLog | None,
) -> dict[str, Any]:
    """The answer to a call (``call``: None if it was refused before it was prepared),
    recorded in its ``tool_result`` entry."""
    duration_ms = (time.perf_counter() - started) * 1000
    route = (call.route or call.spec.route) if call is not None else None
    if isinstance(output, FluffyError):
        answer: dict[str, Any] = {"ok": False, "error": output.to_dict()}
        original: Any = answer["error"]
        meta = {"error_code": output.code}
    else:
        cleaned = sanitizer.sanitize(tool, output)
        answer = {"ok": True, "output": cleaned.value}
        original = output
        meta = {
            "original_chars": str(cleaned.original_chars),
            "sanitized_chars": str(cleaned.sanitized_chars),
            "truncated": str(cleaned.truncated).lower(),
            "redactions": str(cleaned.redactions),
        }
        if cleaned.redacted_kinds:
            meta["redacted_kinds"] = ",".join(cleaned.redacted_kinds)
    if call is not None and call.spec.kind in ("read", "external"):  # changes no session
        session: dict[str, Any] | None = {
            "session_id": call.session.id,
            "mode": call.session.mode,
            "state": call.session.state,
        }
    else:
        session = await session_view(workflow, session_id)
    answer.update(
        tool=tool,
        call_id=call_id,
        route=route,
        duration_ms=round(duration_ms, 3),
        retries=retries,
        session=session,
    )
    if call is not None and call.timings is not None:
        answer["timings"] = call.timings
    encoded = _ENCODE(original)  # the hash of what the tool gave, before sanitising
    await record(
        audit,
        "tool_result",
        call,
        session_id,
        tool,
        input_summary=summarize(call.args if call is not None else args),
        output_summary=summarize(answer.get("output", answer.get("error"))),
        decision=result_decision(call, output),
        duration_ms=duration_ms,
        sandbox_id=call.sandbox_id if call is not None else None,
        metadata={
            "call_id": call_id,
            "original_sha256": hashlib.sha256(encoded).hexdigest(),
            "retries": str(retries),
            **meta,
            **({"policy_requests": _ENCODE(asked).decode()} if asked else {}),
            **(
                {"capability": call.token, "capability_ops": call.token_ops}
                if call is not None and call.token is not None and call.token_ops
                else {}
            ),
            **({"review": call.reviewed} if call is not None and call.reviewed else {}),
            **(
                {"sandbox_warm": "true" if call.timings.get("warm") else "false"}
                if call is not None and call.timings
                else {}
            ),
        },
    )
    return answer


async def session_view(workflow: Workflow, session_id: str) -> dict[str, Any] | None:
    try:
        session = await workflow.get(session_id)
    except FluffyError:
        return None
    return {"session_id": session.id, "mode": session.mode, "state": session.state}


async def record_execute(
    audit: AuditLog | None,
    call: RoutedCall,
    *,
    attempt: int,
    after: FluffyError | None = None,
) -> None:
    meta = {"call_id": call.call_id, "attempt": str(attempt), "route": call.spec.route}
    if after is not None:
        meta["retry_after"] = after.code
    if call.review:
        meta["review_required"] = call.review
    await record(
        audit,
        "tool_execute",
        call,
        call.session.id,
        call.spec.name,
        input_summary=summarize(call.args),
        decision="allowed" if not call.review else "review_required",
        metadata=meta,
    )


async def record(
    audit: AuditLog | None,
    kind: str,
    call: RoutedCall | None,
    session_id: str,
    tool: str,
    *,
    input_summary: str,
    output_summary: str | None = None,
    decision: str | None = None,
    duration_ms: float | None = None,
    sandbox_id: str | None = None,
    metadata: dict[str, str],
) -> None:
    if audit is None:
        return
    session = call.session if call is not None else None
    audit.record_nowait(
        Event(
            kind,
            caller="ai",
            session_id=session_id,
            session_mode=session.mode if session else "strict",
            state_machine_state=session.state if session else "idle",
            syscall_type=tool,
            policy_decision=decision,
            input_summary=input_summary,
            output_summary=output_summary,
            duration_ms=None if duration_ms is None else round(duration_ms, 3),
            sandbox_id=sandbox_id,
            policy_rule_name=call.rule if call is not None else None,
            metadata=metadata,
        )
    )


def result_decision(call: RoutedCall | None, output: Any) -> str | None:
    """The policy decision a tool_result entry carries."""
    if isinstance(output, FluffyError):
        refused = output.code.startswith(("policy.", "tool.unavailable", "tool.refused"))
        return "denied" if refused else ("allowed" if call is not None else None)
    if call is None:
        return None
    if call.review:
        return "review_required"
    return "allowed_by_token" if call.token_ops else "allowed"
