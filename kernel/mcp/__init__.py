"""MCP servers in sandboxes: records, the relay connection, the kernel manager (ADR-046)."""

#: An MCP server's proxy socket's tag is this and the server's name (the audit tells
#: them apart)
PROXY_TAG = "mcp:"
