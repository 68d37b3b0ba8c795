"""The kernel's policy front: every decision is explained in the audit log.

:class:`AuditedPolicy` wraps the engine the kernel uses.  Each evaluation notes its
decision, deciding rule and the request (as data) for the audit entry of the call in
progress (:func:`~fluffy.kernel.ipc.server.note_decision`), and a rule that failed while
being evaluated (it counted as deny) is recorded as ``policy_rule_failed``.  The request
data lets :func:`recent_requests` replay what the log recorded when the policy changes
(meta-policy trial).  :meth:`AuditedPolicy.swap` installs a reloaded engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import Filters, entries
from fluffy.kernel.ipc.server import note_decision
from fluffy.kernel.policy.engine import Caller, Decision, PolicyEngine, Request


def request_data(request: Request) -> dict[str, Any]:
    caller = request.caller
    return {
        "syscall": request.syscall,
        "caller": {"name": caller.name, "tags": sorted(caller.tags)},
        "path": request.path,
        "state": request.state,
        "mode": request.mode,
        "size": request.size,
        "sandbox": request.sandbox,
        **({"issuing": True} if request.issuing else {}),
        **({"command": list(request.command)} if request.command is not None else {}),
    }


def request_from(data: dict[str, Any]) -> Request:
    caller = data.get("caller") or {}
    return Request(
        str(data["syscall"]),
        Caller(str(caller.get("name", "?")), frozenset(caller.get("tags") or ())),
        data.get("path"),
        str(data.get("state", "idle")),
        str(data.get("mode", "strict")),
        data.get("size"),
        data.get("sandbox"),
        issuing=bool(data.get("issuing", False)),
        command=_command(data.get("command")),
    )


def _command(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, list) and all(isinstance(arg, str) for arg in value):
        return tuple(value)
    return None


class AuditedPolicy:
    def __init__(self, engine: PolicyEngine, audit: AuditLog | None = None) -> None:
        self.engine = engine
        self.audit = audit

    def swap(self, engine: PolicyEngine) -> None:
        self.engine = engine

    def as_evaluated(self, request: Request) -> Request:
        """The request as the engine will see it (a wrapper may add tags): what the
        audit log must record for a later trial to replay the same decision."""
        return request

    def evaluate(self, request: Request) -> Decision:
        decision = self.engine.evaluate(request)
        reason = "; ".join(decision.reasons) if decision.result != "allow" else None
        note_decision(decision.audit_decision, decision.decided_by, reason, request_data(request))
        if self.audit is not None:
            for verdict in decision.matched:
                if verdict.failed:
                    self.audit.record_nowait(
                        Event(
                            "policy_rule_failed",
                            syscall_type=request.syscall,
                            caller=request.caller.name,
                            session_mode=request.mode,
                            state_machine_state=request.state,
                            policy_decision="denied",
                            policy_rule_name=verdict.rule,
                            deny_reason=verdict.reason[:500],
                            input_summary=f"{request.syscall} {request.path or ''}".strip(),
                        )
                    )
        return decision


#: Entries whose policy request is recorded elsewhere: a tool call's requests are in its
#: ``tool_result`` entry (the syscall entry of ``tool.call`` would count them twice).
_RECORDED_BY_TOOL_RESULT = frozenset({"tool.call", "tool.batch"})


def _decoded(raw: Any) -> list[Request]:
    try:
        data = msgspec.json.decode(raw)
        items = data if isinstance(data, list) else [data]
        return [request_from(item) for item in items]
    except (msgspec.DecodeError, KeyError, TypeError, ValueError, AttributeError):
        return []


def is_ai(request: Request) -> bool:
    """A decision made for the model's tool calls (the router tags them ``ai``)."""
    return "ai" in request.caller.tags


def recent_requests(state_dir: Path, limit: int = 100) -> list[Request]:
    """The policy requests of the newest ``limit`` audited decisions and of the model's
    newest ``limit``, oldest first (each once).

    A decision is on record in a ``syscall`` entry (a call on a socket) or, for the
    model's tool calls (which run in the background, outside any socket call), in the
    call's ``tool_result`` entry, one request per path the call named.
    """
    found: list[tuple[tuple[int, int], Request]] = []
    for kind, key in (("syscall", "policy_request"), ("tool_result", "policy_requests")):
        for entry in entries(state_dir, Filters(event_type=kind, limit=limit * 4)):
            metadata = entry["metadata"] if isinstance(entry["metadata"], dict) else {}
            raw = metadata.get(key)
            if not raw or entry.get("syscall_type") in _RECORDED_BY_TOOL_RESULT:
                continue
            for index, request in enumerate(_decoded(raw)):
                found.append(((int(entry["id"]), index), request))
    found.sort(key=lambda item: item[0])
    newest = {key for key, _ in found[-limit:]}
    newest |= {key for key, _ in [item for item in found if is_ai(item[1])][-limit:]}
    return [request for key, request in found if key in newest]
