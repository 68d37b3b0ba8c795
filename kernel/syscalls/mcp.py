"""The MCP syscalls on the CLI's socket: ``mcp.list`` and ``mcp.reload``.

``fluffy mcp add`` / ``remove`` write the records on the host and then ask a running
kernel to read them again (``mcp.reload``): servers whose record changed or went are
stopped, and the tools offered change with the next model request.
"""

from __future__ import annotations

from typing import Any

from fluffy.ipc.results.admin import McpReloaded, McpServerList
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.syscalls import CLI, NoParams, Syscall, SyscallTable
from fluffy.kernel.mcp.servers import PREFIX, McpServers, split_name
from fluffy.kernel.tools.routing.router import ToolRouter


def mcp_methods(router: ToolRouter, mcp: McpServers | None, audit: AuditLog | None) -> SyscallTable:
    async def list_servers(context: CallContext, params: NoParams) -> dict[str, Any]:
        servers = mcp.status() if mcp is not None else []
        return {"servers": servers}

    async def reload(context: CallContext, params: NoParams) -> dict[str, Any]:
        if mcp is None:
            return {"servers": [], "stopped": [], "tools": 0}
        specs, stopped, changed = await mcp.reload()
        router.offer_mcp(PREFIX, specs, lambda tool: split_name(tool)[0] in changed)
        if audit is not None:
            audit.record_nowait(
                Event(
                    "mcp_servers_loaded",
                    caller="user",
                    input_summary=f"MCP servers reloaded: {', '.join(sorted(mcp.servers))}"[:500]
                    or "no MCP servers",
                    metadata={
                        "servers": ",".join(sorted(mcp.servers))[:400],
                        "tools": str(len(specs)),
                        "stopped": ",".join(stopped),
                        "problems": "; ".join(f"{k}: {v}" for k, v in mcp.problems.items())[:400],
                    },
                )
            )
        return {"servers": mcp.status(), "stopped": stopped, "tools": len(specs)}

    return SyscallTable(
        [
            Syscall("mcp.list", NoParams, list_servers, McpServerList, since=1),
            Syscall(
                "mcp.reload",
                NoParams,
                reload,
                McpReloaded,
                since=1,
                callers=CLI,
                refusal="reload the project's MCP servers",
            ),
        ]
    )
