"""An MCP server's tool call, with the user's yes first when policy asks for review.

Only a model's turn asks the user (a client's direct call is refused instead), and the
user sees every argument the server will get, or is not asked at all (ADR-046).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from fluffy.errors import PolicyDenied, ToolRefused
from fluffy.kernel.tools.core.routedcall import TURN_PRIORITY, Reviewer, RoutedCall

#: An MCP call held for review shows the user all its arguments; longer ones are refused.
MAX_SHOWN_ARGUMENTS = 16_000


class McpCalls(Protocol):
    """What the router needs of the project's MCP servers (kernel/mcp/servers.py's
    ``McpServers``, which builds on the tool registry: the router only sees this)."""

    def check_arguments(self, tool: str, args: Any) -> None: ...

    async def call(self, tool: str, args: dict[str, Any], timeout_s: float) -> dict[str, Any]: ...

    def sandbox_of(self, tool: str) -> str | None: ...


async def call_mcp(
    call: RoutedCall,
    *,
    mcp: McpCalls,
    reviewer: Reviewer | None,
    session_allowed: dict[str, set[str]],
    timeout_s: float,
) -> dict[str, Any]:
    """Run ``call`` on its MCP server (``session_allowed``: the tools the user allowed
    for the rest of a session, by session id; a yes for the session is added to it)."""
    if call.review is not None:
        await ask_user(call, reviewer=reviewer, session_allowed=session_allowed)
    result = await mcp.call(call.spec.name, call.args, timeout_s)
    call.sandbox_id = mcp.sandbox_of(call.spec.name)
    return result


async def ask_user(
    call: RoutedCall,
    *,
    reviewer: Reviewer | None,
    session_allowed: dict[str, set[str]],
    key: str | None = None,
    allow_with: str | None = None,
    shown_extra: dict[str, Any] | None = None,
) -> None:
    """Ask the person about ``call`` (held for review) and wait for the answer.

    ``key``: what a yes "for this session" covers (default: the tool; ``container.run``:
    the one command); ``allow_with``: the policy rule that would stop the asking, for
    the refusals; ``shown_extra``: more for the person to read (the command line).
    """
    spec, sid = call.spec, call.session.id
    key = key or spec.name
    family = spec.name.rsplit(".", 1)[0]
    allow_with = allow_with or f"a policy rule (syscall: {family}.*, action: allow)"
    if key in session_allowed.get(sid, set()):
        call.reviewed = "allowed for this session by the user"
        return
    if reviewer is None or call.priority != TURN_PRIORITY:
        raise PolicyDenied(
            f"{spec.name} needs the user's review",
            why=(call.review or "")
            + "; only a model's turn asks the user (this call came from a client)",
            fix=f"Allow it with {allow_with}.",
        )
    # the user sees every argument the tool will get, or is not asked at all
    shown_args = json.dumps(call.args, sort_keys=True, ensure_ascii=False, indent=1)
    if len(shown_args) > MAX_SHOWN_ARGUMENTS:
        raise ToolRefused(
            f"{spec.name} was not run: its arguments are too long to show the user",
            why=f"{len(shown_args)} characters; a call is reviewed only in full "
            f"(at most {MAX_SHOWN_ARGUMENTS})",
            fix=f"Call it with shorter arguments, or ask the user to allow it with {allow_with}.",
        )
    shown = {
        "review_id": call.call_id,
        "tool": spec.name,
        "arguments": shown_args,
        "reason": call.review,
        "description": spec.description[:300],
        "allow_with": allow_with,
        **(shown_extra or {}),
    }
    decision = await reviewer(sid, shown)
    said = str(decision.get("decision"))
    if said == "allow_session":
        session_allowed.setdefault(sid, set()).add(key)
        call.reviewed = "allowed for this session by the user"
    elif said == "allow":
        call.reviewed = "allowed once by the user"
    else:
        reason = str(decision.get("reason") or "").strip()
        raise ToolRefused(
            f"the user refused {spec.name}",
            why=(f'they said: "{reason}"' if reason else "the call was held for review")
            + f" ({call.review})",
        )
