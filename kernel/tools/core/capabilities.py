"""Capability tokens on the live path (design: Capability System, steps 1-5).

A write the model asks for runs in a plugin sandbox.  The router's policy check is the
check *before issuing* (a rule's ``require_capability_token`` is met by the token to
come); when the sandbox's host takes the call (``tool.next``), the kernel issues a token
for exactly the call's paths -- bound to that sandbox's container and the connection that
took the call, one use per path (``max_ops``), living as long as the call may (TTL),
each use with a nonce greater than the last.  The host presents it with each change it
returns; the kernel checks every change with the token before staging it (the engine's
token fast path: built-ins still run), so a change to another path, a second use, a
replayed nonce or a token from another sandbox is refused.  When the call is over the
token is revoked.  Issued (``capability_issued``, durable), used (the call's
``tool_result`` entry: ``capability_ops``, decision ``allowed_by_token``) and expired
(``capability_expired``: uses, and why it ended) are all in the audit log; the token
itself never is (a digest names it).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

import msgspec

from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.policy.tokens import CapabilityToken, TokenStore


class Scope(msgspec.Struct, frozen=True):
    """What a call's token will cover: its syscall on exactly its paths."""

    syscall: str
    paths: tuple[str, ...]


def token_ref(token_id: str) -> str:
    """How the audit log names a token (a digest: the token itself is a secret)."""
    return hashlib.sha256(token_id.encode()).hexdigest()[:16]


class Capabilities:
    """Issues and revokes the tokens of plugin calls (on the kernel's event loop)."""

    def __init__(
        self,
        tokens: TokenStore,
        clock: Callable[[], float],
        audit: AuditLog | None = None,
    ) -> None:
        self.tokens = tokens
        self.clock = clock
        self.audit = audit

    def begin_issue(
        self,
        scope: Scope,
        *,
        container_id: str,
        connection: str,
        ttl_s: float,
        call_id: str,
        plugin: str,
        sandbox_id: str | None = None,
    ) -> tuple[CapabilityToken, asyncio.Future[None]]:
        """A token at once, and the future of its ``capability_issued`` entry's durable
        commit: the caller hands the token out meanwhile, and accepts no use of it
        before that future is done (the design's synchronous write: never lost before
        the capability is exercised).  Call on the kernel's loop."""
        token = self.tokens.issue(
            container_id=container_id,
            connection=connection,
            syscall=scope.syscall,
            paths=frozenset(scope.paths),
            max_ops=max(1, len(scope.paths)),
            now=self.clock(),
            ttl_s=ttl_s,
        )
        if self.audit is None:
            recorded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            recorded.set_result(None)
            return token, recorded
        recorded = self.audit.record_soon(  # in the chain now, durable when it is done
            Event(
                "capability_issued",
                caller="kernel",
                syscall_type=scope.syscall,
                sandbox_id=sandbox_id or container_id[:12],
                input_summary=f"token for {plugin}: {scope.syscall} on "
                f"{', '.join(scope.paths)[:300]}",
                metadata={
                    "token": token_ref(token.token_id),
                    "call_id": call_id,
                    "plugin": plugin,
                    "max_ops": str(token.max_ops),
                    "ttl_s": f"{ttl_s:g}",
                },
            )
        )
        # a call that ends before its result never reads the outcome: read it here
        recorded.add_done_callback(lambda f: f.cancelled() or f.exception())
        return token, recorded

    def expire(self, token_id: str, call_id: str, *, why: str = "the call is over") -> None:
        """Revoke a call's token and record how much of it was used."""
        token = self.tokens.revoke(token_id)
        if token is None or self.audit is None:
            return
        if self.clock() >= token.expires_at:
            why = "its time ran out"
        elif token.ops_used >= token.max_ops:
            why = f"used up; {why}"
        self.audit.record_nowait(
            Event(
                "capability_expired",
                caller="kernel",
                syscall_type=token.syscall,
                sandbox_id=token.container_id[:12],
                input_summary=f"token {token_ref(token_id)} ended ({why}): "
                f"{token.ops_used} of {token.max_ops} uses",
                metadata={
                    "token": token_ref(token_id),
                    "call_id": call_id,
                    "ops_used": str(token.ops_used),
                    "max_ops": str(token.max_ops),
                    "reason": why,
                },
            )
        )
