"""MCP server records (``.fluffy/mcp/``) and a connection to list a server's tools."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluffy.host import lazy

if TYPE_CHECKING:
    from fluffy.kernel.mcp.connection import McpConnection
    from fluffy.kernel.mcp.record import (
        McpServer,
        check_name,
        load_records,
        remove_record,
        save_record,
    )

_FROM = {
    "check_name": "fluffy.kernel.mcp.record",
    "load_records": "fluffy.kernel.mcp.record",
    "McpConnection": "fluffy.kernel.mcp.connection",
    "McpServer": "fluffy.kernel.mcp.record",
    "remove_record": "fluffy.kernel.mcp.record",
    "save_record": "fluffy.kernel.mcp.record",
}
__all__ = [
    "McpConnection",
    "McpServer",
    "check_name",
    "load_records",
    "remove_record",
    "save_record",
]
__getattr__ = lazy(__name__, _FROM)
