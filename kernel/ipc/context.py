"""What a method handler knows about its call: the caller's context, the audit record.

A handler gets a :class:`CallContext` (binding, peer, plugin name, API version) and may
note the policy decision that its call's audit entry carries (:func:`note_decision`);
the server hands each finished call to an observer as a :class:`CallRecord`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import msgspec

from fluffy.errors import FluffyError
from fluffy.ipc.transport import PeerIdentity, container_of_pid

if TYPE_CHECKING:
    from fluffy.kernel.ipc.connection import Connection
    from fluffy.kernel.ipc.server import KernelServer


class CallContext(msgspec.Struct):
    """What a handler knows about its caller."""

    binding: str
    peer: PeerIdentity
    plugin_name: str
    plugin_version: str
    api_version: int
    server: KernelServer
    connection: Connection

    _container_id: str | None = None
    _container_known: bool = False
    _identity: dict[str, Any] | None = None

    @property
    def container_id(self) -> str | None:
        """The container of the peer's pid, where the pid is visible (not across pid ns).

        Read once per connection: a connection's peer process does not change.
        """
        if not self._container_known:
            self._container_id = container_of_pid(self.peer.pid)
            self._container_known = True
        return self._container_id

    def identity(self) -> dict[str, Any]:
        """The caller as ``kernel.ping`` shows it, made once per connection (it does not
        change; the dict is only ever encoded, never changed)."""
        if self._identity is None:
            peer = self.peer
            self._identity = {
                "binding": self.binding,
                "plugin_name": self.plugin_name,
                "peer_pid": peer.pid,
                "peer_uid": peer.uid,
                "peer_gid": peer.gid,
                "container_id": self.container_id,
            }
        return self._identity

    def send_event(self, method: str, params: Any = None) -> None:
        self.connection.send_event(method, params)


Handler = Callable[[CallContext, Any], Any]

#: Methods the audit observer does not see (health checks).
UNAUDITED = frozenset({"kernel.ping"})


class CallRecord(msgspec.Struct, frozen=True):
    """One request the kernel received, as the audit log records it."""

    method: str
    request_id: str
    params: Any
    binding: str
    plugin_name: str
    peer: PeerIdentity
    container_id: str | None
    result: Any
    error: FluffyError | None
    duration_ms: float
    decision: str
    rule: str | None
    reason: str | None
    policy_request: dict[str, Any] | None = None


Observer = Callable[[CallRecord], None]
Noted = tuple[str, str | None, str | None, dict[str, Any] | None]
decision_var: ContextVar[Noted | None] = ContextVar("fluffy_decision", default=None)


def note_decision(
    decision: str,
    rule: str | None = None,
    reason: str | None = None,
    request: dict[str, Any] | None = None,
) -> None:
    """Called by the policy layer inside a handler: the audit entry carries this decision.

    ``request`` is the policy request as data, so that a later policy change can be
    tried on what the log recorded (meta-policy).
    """
    decision_var.set((decision, rule, reason, request))


AsyncHandler = Callable[[CallContext, Any], Awaitable[Any]]
