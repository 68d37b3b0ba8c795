"""MCP servers in sandboxes: records, the relay connection, the kernel manager (ADR-046)."""
