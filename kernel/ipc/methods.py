"""The kernel's method table (closed: anything not listed is refused, nothing runs).

Method names are the design's syscall names; later modules add theirs (``fs.read``,
``fs.write``, ``test.run``, ...).  Each handler takes ``(context, params)``.
"""

from __future__ import annotations

from typing import Any

from fluffy.errors import InvalidPayload
from fluffy.ipc.protocol import KERNEL_VERSION
from fluffy.kernel.ipc.server import CallContext, Handler


def ping(context: CallContext, params: Any) -> dict[str, Any]:
    """Health check; shows the caller's identity and the audit head (for an outside witness)."""
    if params not in (None, {}):
        raise InvalidPayload("kernel.ping takes no parameters")
    peer = context.peer
    head, memory = context.server.audit_head, context.server.memory
    scheduler = context.server.scheduler
    return {
        "audit_head": head() if head is not None else None,
        "memory": memory() if memory is not None else None,
        "scheduler": scheduler() if scheduler is not None else None,
        "pong": True,
        "kernel_version": KERNEL_VERSION,
        "api_version": context.api_version,
        "identity": {
            "binding": context.binding,
            "plugin_name": context.plugin_name,
            "peer_pid": peer.pid,
            "peer_uid": peer.uid,
            "peer_gid": peer.gid,
            "container_id": context.container_id,
        },
    }


def default_methods() -> dict[str, Handler]:
    return {"kernel.ping": ping}
