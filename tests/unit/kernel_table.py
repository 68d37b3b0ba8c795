"""The kernel's served syscall table, built by kernel/serve.py's own function.

The handlers close over the kernel's objects (workflow, policy front, tool router, ...);
here those are stand-ins, since only the declarations are read: names, params types,
callers, since.  Nothing is called on them while the table is built.  The same goes for
the tables of the sandboxes' own sockets (:func:`sandbox_tables`).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from unittest.mock import MagicMock

from fluffy.kernel.ai.provider import ProviderSession
from fluffy.kernel.ipc.syscalls import SyscallTable
from fluffy.kernel.policy.extensions import extension_syscalls
from fluffy.kernel.serve import kernel_syscalls
from fluffy.kernel.syscalls.assemble_ai import AiLayer
from fluffy.kernel.syscalls.assemble_tools import ToolPath
from fluffy.kernel.tools.sandbox.pluginsocket import PluginSocket


@cache
def served_table() -> SyscallTable:
    tools = ToolPath(
        router=MagicMock(), flow=MagicMock(), sandboxes=None, runner=None, scheduler=MagicMock()
    )
    ai = AiLayer(loop=MagicMock(), proxy=MagicMock(), runner=MagicMock(), store=MagicMock())
    return kernel_syscalls(
        workflow=MagicMock(),
        accepting_work=lambda: True,
        front=MagicMock(),
        policy_path=None,
        state_dir=Path("/nonexistent/state"),
        audit=MagicMock(),
        reloaded=lambda _policy: None,
        default_text=None,
        rules=None,
        project=None,
        layout=None,
        tools=tools,
        ai=ai,
    )


def sandbox_tables() -> dict[str, SyscallTable]:
    """The tables the sandboxes' own sockets serve, built by the code that serves them."""
    session = ProviderSession(MagicMock(), "ai:s:t", Path("/nonexistent/ai"))
    return {
        "plugin": PluginSocket({}, None).methods("demo"),
        "ai-provider": session.methods(),
        "policy": extension_syscalls(MagicMock()),
    }
