"""``kernel.ping``, the one syscall of API 0 (health check and identity).

Each area declares its syscalls in its module of this package (``workflow.py``,
``ai.py``, ...) as :class:`~fluffy.kernel.ipc.syscalls.Syscall` records; the
kernel joins them into one :class:`~fluffy.kernel.ipc.syscalls.SyscallTable`
(:func:`fluffy.kernel.serve.kernel_syscalls`), closed: anything not listed is refused
and nothing runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from fluffy.ipc.protocol import KERNEL_VERSION
from fluffy.ipc.results.admin import Pong
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.syscalls import Syscall, SyscallTable

if TYPE_CHECKING:
    from fluffy.kernel.audit.log import AuditLog
    from fluffy.kernel.audit.store import Head


class PingParams(msgspec.Struct, forbid_unknown_fields=True):
    """kernel.ping's params (``null`` or ``{}``: the figures too)."""

    #: false: health, identity and the audit head only, without the kernel's memory and
    #: scheduler figures (~15 us to gather, ~1.5 KB to send): what a health check asks
    figures: bool = True


def ping(context: CallContext, params: PingParams) -> dict[str, Any]:
    """Health check; shows the caller's identity and the audit head (for an outside
    witness), and unless ``figures`` is false the kernel's memory and scheduler figures."""
    head = context.server.audit_head
    answer = {
        "audit_head": head() if head is not None else None,
        "pong": True,
        "kernel_version": KERNEL_VERSION,
        "api_version": context.api_version,
        "identity": context.identity(),
    }
    if params.figures:
        memory, scheduler = context.server.memory, context.server.scheduler
        answer["memory"] = memory() if memory is not None else None
        answer["scheduler"] = scheduler() if scheduler is not None else None
    return answer


def witnessed(audit: AuditLog) -> Callable[[], dict[str, Any] | None]:
    """The audit's durable head as ``kernel.ping`` sends it (None: no entry yet), made
    once per head rather than on every health check."""
    kept: tuple[Head | None, dict[str, Any] | None] = (None, None)  # by identity: a
    # commit makes a new head

    def head() -> dict[str, Any] | None:
        nonlocal kept
        durable = audit.durable_head
        if durable is not kept[0]:
            kept = (durable, durable.to_dict() if durable.seq else None)
        return kept[1]

    return head


def default_methods() -> SyscallTable:
    return SyscallTable([Syscall("kernel.ping", PingParams, ping, Pong, since=0)])
