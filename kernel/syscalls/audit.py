"""The audit log's syscall: ``audit.flush`` (the CLI's, before it reads the log).

Operational entries are committed in batches, up to the flush interval after they were
recorded; ``fluffy audit log`` asks the running kernel to commit what it holds first,
so a person (or a test) reading the log right after an action sees that action.
"""

from __future__ import annotations

from typing import Any

from fluffy.ipc.results.admin import AuditFlushed
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.syscalls import CLI, NoParams, Syscall, SyscallTable


def audit_methods(audit: AuditLog) -> SyscallTable:
    async def flush(context: CallContext, params: NoParams) -> dict[str, Any]:
        await audit.flush()
        return {"seq": audit.durable_head.seq}

    return SyscallTable(
        [Syscall("audit.flush", NoParams, flush, AuditFlushed, since=1, callers=CLI,
                 refusal="flush the audit log")]
    )  # fmt: skip
