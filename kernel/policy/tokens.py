"""Capability tokens (design: Capability System).

Short-lived, operation-level: bound to ``(container_id, connection)`` (the IPC identity
of ADR-011, standing in for the design's peer pid), scoped to one syscall and a path
glob, limited in uses (``max_ops``) and time (TTL, default 30 s).  Each use carries a
nonce that must be greater than the last one used: replays are refused.  Validity is
judged against the time snapshot the engine takes once per evaluation.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field

import msgspec

from fluffy.kernel.globs import GlobSet

DEFAULT_TTL_S = 30.0
#: A token stays in the store until its call ends (:meth:`TokenStore.revoke`), used up or
#: expired, so the end is recorded with its uses; one whose call never ended (a lost
#: teardown) is forgotten this long after it expired.
FORGET_AFTER_S = 600.0


class TokenUse(msgspec.Struct, frozen=True):
    """What a request presents: the token and this use's nonce."""

    token_id: str
    nonce: int


@dataclass
class CapabilityToken:
    token_id: str
    container_id: str
    connection: str
    syscall: str
    path_glob: tuple[str, ...]
    max_ops: int
    expires_at: float
    ops_used: int = 0
    last_nonce: int = 0
    #: Exact paths instead of globs (a call's own files: no pattern can widen them).
    paths: frozenset[str] | None = None
    _spec: GlobSet | None = field(default=None, repr=False)

    def covers(self, path: str | None) -> bool:
        if self.paths is not None:
            return path in self.paths
        if not self.path_glob:
            return path is None
        if path is None:
            return False
        if self._spec is None:
            self._spec = GlobSet(self.path_glob)
        return self._spec.match(path)


class TokenStore:
    """Tokens by id.  Thread-safe: a check-and-consume is one step under a lock."""

    def __init__(self) -> None:
        self.tokens: dict[str, CapabilityToken] = {}
        self._lock = threading.Lock()

    def issue(
        self,
        *,
        container_id: str,
        connection: str,
        syscall: str,
        path_glob: tuple[str, ...] = (),
        paths: frozenset[str] | None = None,
        max_ops: int = 1,
        now: float,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> CapabilityToken:
        with self._lock:  # forget tokens whose call never ended (see FORGET_AFTER_S)
            for stale in [t for t in self.tokens.values() if now >= t.expires_at + FORGET_AFTER_S]:
                del self.tokens[stale.token_id]
        token = CapabilityToken(
            token_id=secrets.token_urlsafe(24),
            container_id=container_id,
            connection=connection,
            syscall=syscall,
            path_glob=tuple(path_glob),
            max_ops=max_ops,
            expires_at=now + ttl_s,
            paths=paths,
        )
        with self._lock:
            self.tokens[token.token_id] = token
        return token

    def revoke(self, token_id: str) -> CapabilityToken | None:
        """Forget a token (its call is over); the token as it was, None if unknown."""
        with self._lock:
            return self.tokens.pop(token_id, None)

    def check(
        self,
        use: TokenUse,
        *,
        container_id: str | None,
        connection: str | None,
        syscall: str,
        path: str | None,
        now: float,
    ) -> str | None:
        """Why the token does not apply (None: it applies, and this use is consumed)."""
        with self._lock:  # check and consume are one step
            token = self.tokens.get(use.token_id)
            if token is None:
                return "unknown token"
            if now >= token.expires_at:  # kept: its call's end records it
                return "token expired"
            if token.container_id != container_id or token.connection != connection:
                return "token bound to another container or connection"
            if token.syscall != syscall or not token.covers(path):
                return "token does not cover this syscall or path"
            if token.ops_used >= token.max_ops:
                return "token used up (maxOps)"
            if use.nonce <= token.last_nonce:
                return "nonce not greater than the last one: replay refused"
            token.ops_used += 1
            token.last_nonce = use.nonce
            return None
