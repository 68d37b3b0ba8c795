"""What the kernel makes of an MCP server's answers: the tools it lists (each checked as
a record; a bad tool is skipped with its reason, never the whole server) and a
``tools/call`` result (content items reduced to what the model may see)."""

from __future__ import annotations

from typing import Any

from mcp import types
from pydantic import ValidationError

from fluffy.kernel.mcp.record import MAX_TOOLS, McpTool

MAX_LISTED = 128


def usable_tools(listed: list[types.Tool]) -> tuple[list[McpTool], dict[str, str]]:
    """The tools that pass the record's checks; the others by name, with the reason (a
    server is not refused for one bad tool)."""
    tools: list[McpTool] = []
    skipped: dict[str, str] = {}
    for tool in listed:
        name = str(tool.name)[:80]
        if len(tools) >= MAX_TOOLS:
            skipped[name] = f"more than {MAX_TOOLS} tools"
            continue
        try:
            tools.append(tool_record(tool))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            skipped[name] = f"{where}: {first['msg']}"[:200]
        if len(skipped) >= MAX_LISTED:
            break
    return tools, skipped


def tool_record(tool: types.Tool) -> McpTool:
    annotations = tool.annotations
    return McpTool(
        name=tool.name,
        description=(tool.description or "")[:2000],
        input_schema=dict(tool.input_schema or {"type": "object"}),
        read_only=bool(annotations is not None and annotations.read_only_hint),
    )


#: What the model gets of a content item (MCP: text, image, audio, resource, link).
def _content(item: Any) -> dict[str, Any]:
    kind = getattr(item, "type", "")
    if kind == "text":
        return {"type": "text", "text": str(item.text)}
    if kind in ("image", "audio"):
        size = len(str(getattr(item, "data", "")) or "") * 3 // 4
        return {"type": kind, "mime_type": str(getattr(item, "mime_type", "")), "bytes": size,
                "note": f"{kind} content is not passed to the model"}  # fmt: skip
    if kind == "resource":
        resource = item.resource
        text = getattr(resource, "text", None)
        body = {"text": str(text)} if text is not None else {"note": "binary resource"}
        return {"type": "resource", "uri": str(resource.uri), **body}
    if kind == "resource_link":
        return {"type": "resource_link", "uri": str(item.uri), "name": str(item.name)}
    return {"type": str(kind) or "unknown", "note": "content of an unknown type"}


def result_dict(result: Any) -> dict[str, Any]:
    """A ``tools/call`` result as the router returns it (then sanitised and capped)."""
    out: dict[str, Any] = {
        "is_error": bool(getattr(result, "is_error", False)),
        "content": [_content(item) for item in (getattr(result, "content", None) or [])],
    }
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        out["structured"] = structured
    return out
