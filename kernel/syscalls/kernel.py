"""``kernel.ping``, the one syscall of API 0 (health check and identity).

Each area declares its syscalls in its module of this package (``workflow.py``,
``ai.py``, ...) as :class:`~fluffy.kernel.ipc.syscalls.Syscall` records; the
kernel joins them into one :class:`~fluffy.kernel.ipc.syscalls.SyscallTable`
(:func:`fluffy.kernel.serve.kernel_syscalls`), closed: anything not listed is refused
and nothing runs.
"""

from __future__ import annotations

from typing import Any

from fluffy.ipc.protocol import KERNEL_VERSION
from fluffy.ipc.results.admin import Pong
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.syscalls import NoParams, Syscall, SyscallTable


def ping(context: CallContext, params: NoParams) -> dict[str, Any]:
    """Health check; shows the caller's identity and the audit head (for an outside witness)."""
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


def default_methods() -> SyscallTable:
    return SyscallTable([Syscall("kernel.ping", NoParams, ping, Pong, since=0)])
