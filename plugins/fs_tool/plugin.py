"""The fs tool plugin: ``fs.write``, ``fs.edit``, ``fs.delete``.

Writes never touch the project: each tool turns its arguments into a change against the
view (a unified diff for ``fs.write`` / ``fs.edit``, a deletion for ``fs.delete``) that
the kernel validates, reviews and merges.
"""

from __future__ import annotations

from typing import Any

from fluffy.errors import ToolInputInvalid
from fluffy.plugins.sdk import Handler, ToolContext, ToolDefinition, ToolPlugin, normalise_path

PATH = {
    "type": "string",
    "minLength": 1,
    "maxLength": 4096,
    "description": "File path relative to the project root, e.g. 'src/app.py'.",
}

WRITE = ToolDefinition(
    name="fs.write",
    description="Write a file's complete new content (creates the file if it is missing). "
    "The change is staged as a patch for review; the project is not written directly.",
    input_schema={
        "type": "object",
        "properties": {
            "path": PATH,
            "content": {"type": "string", "description": "The file's full new content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    output_mode="patch",
    timeout_s=30,
)
EDIT = ToolDefinition(
    name="fs.edit",
    description="Replace an exact piece of text in a file. old_string must occur exactly "
    "once unless replace_all is true. Whitespace and indentation must match.",
    input_schema={
        "type": "object",
        "properties": {
            "path": PATH,
            "old_string": {"type": "string", "minLength": 1, "description": "Text to replace."},
            "new_string": {"type": "string", "description": "Replacement text."},
            "replace_all": {
                "type": "boolean",
                "default": False,
                "description": "Replace every occurrence instead of exactly one.",
            },
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": False,
    },
    output_mode="patch",
    timeout_s=30,
)
DELETE = ToolDefinition(
    name="fs.delete",
    description="Delete a file of the project (staged for review like every change).",
    input_schema={
        "type": "object",
        "properties": {"path": PATH},
        "required": ["path"],
        "additionalProperties": False,
    },
    output_mode="patch",
    timeout_s=30,
)


def write(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    path = normalise_path(args["path"])
    created = not ctx.file_exists(path)
    change = ctx.emit_patch(path, args["content"])
    return {"path": path, "created": created, "changed": change is not None}


def edit(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    path = normalise_path(args["path"])
    old, new = args["old_string"], args["new_string"]
    if old == new:
        raise ToolInputInvalid(
            "old_string and new_string are the same: nothing would change",
            fix="Give the new text in new_string.",
        )
    text = ctx.read_file(path)
    count = text.count(old)
    if count == 0:
        raise ToolInputInvalid(
            f"old_string was not found in {path}",
            why="the replacement needs an exact match, whitespace and indentation included",
            fix="Read the file again and copy the exact text to replace.",
        )
    if count > 1 and not args["replace_all"]:
        raise ToolInputInvalid(
            f"old_string occurs {count} times in {path}",
            why="without replace_all the text to replace must be unique",
            fix="Include more surrounding lines in old_string, or set replace_all to true.",
        )
    replaced = count if args["replace_all"] else 1
    ctx.emit_patch(path, text.replace(old, new, replaced))
    return {"path": path, "replacements": replaced}


def delete(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    path = normalise_path(args["path"])
    ctx.emit_delete(path)
    return {"path": path, "deleted": True}


class FsTool(ToolPlugin):
    name = "fs-tool"
    version = 1

    def tools(self) -> list[ToolDefinition]:
        return [WRITE, EDIT, DELETE]

    def handlers(self) -> dict[str, Handler]:
        return {"fs.write": write, "fs.edit": edit, "fs.delete": delete}


PLUGIN = FsTool()
