"""The search tool plugin: ``search.grep`` (regex over file contents) and ``search.glob``.

Both read the view (project + staged changes), skip ``.git``, never follow symbolic
links, and leave out binary files (a NUL byte in the first 8 KiB) and files over 1 MiB.
"""

from __future__ import annotations

import re
from typing import Any

from fluffy.errors import ToolInputInvalid
from fluffy.plugins.sdk import Entry, Handler, ToolContext, ToolDefinition, ToolPlugin
from fluffy.plugins.sdk import normalise_path as normalise
from fluffy.plugins.search_tool.globs import Glob

MAX_FILE_BYTES = 1024 * 1024
BINARY_PROBE = 8192
MAX_LINE_CHARS = 1000

GREP = ToolDefinition(
    name="search.grep",
    description="Search file contents with a Python regular expression; returns matching "
    "lines (path, 1-based line number, text). Skips binary files and files over 1 MiB.",
    input_schema={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "minLength": 1, "maxLength": 1000},
            "path": {
                "type": "string",
                "default": ".",
                "maxLength": 4096,
                "description": "Folder or file to search, relative to the project root.",
            },
            "glob": {
                "type": "string",
                "maxLength": 1000,
                "description": "Only files matching this glob, e.g. '*.py' or 'src/**/*.ts'.",
            },
            "case_insensitive": {"type": "boolean", "default": False},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 5000, "default": 200},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
    read_only=True,
    truncation="head",
    timeout_s=60,
)
GLOB = ToolDefinition(
    name="search.glob",
    description="List the project's files matching a glob ('**/*.py', 'tests/test_*.py'; "
    "a pattern without '/' matches file names at any depth).",
    input_schema={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "minLength": 1, "maxLength": 1000},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
    read_only=True,
    truncation="head",
    timeout_s=60,
)


def _text(entry: Entry) -> str | None:
    """The file's text, or None when it is skipped (too big, binary, gone)."""
    try:
        if entry.source.stat().st_size > MAX_FILE_BYTES:
            return None
        data = entry.source.read_bytes()
    except OSError:
        return None
    if b"\x00" in data[:BINARY_PROBE]:
        return None
    return data.decode("utf-8", "replace")


def _files(ctx: ToolContext, path: str) -> list[Entry]:
    if not ctx.is_dir(path) and not ctx.file_exists(path):
        raise ToolInputInvalid(
            f"{path} is neither a file nor a folder of the project",
            fix="Give an existing folder (default '.') or file.",
        )
    return [entry for entry in ctx.walk(path) if entry.link is None]


def grep(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    try:
        regex = re.compile(args["pattern"], re.IGNORECASE if args["case_insensitive"] else 0)
    except re.error as exc:
        raise ToolInputInvalid(
            f"pattern is not a valid Python regular expression: {exc}",
            fix="Escape special characters (e.g. '\\(' for a literal parenthesis).",
        ) from None
    wanted = Glob(args["glob"]) if args.get("glob") else None
    limit = args["max_results"]
    matches: list[dict[str, Any]] = []
    for entry in _files(ctx, normalise(args["path"], allow_root=True)):
        if wanted is not None and not wanted.matches(entry.path):
            continue
        text = _text(entry)
        if text is None:
            continue
        for number, line in enumerate(text.split("\n"), start=1):
            line = line.removesuffix("\r")
            if regex.search(line) is None:
                continue
            if len(matches) == limit:
                return {"matches": matches, "truncated": True}
            matches.append({"path": entry.path, "line": number, "text": line[:MAX_LINE_CHARS]})
    return {"matches": matches, "truncated": False}


def glob(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    wanted = Glob(args["pattern"])
    limit = args["max_results"]
    paths: list[str] = []
    for entry in ctx.walk("."):
        if entry.link is None and wanted.matches(entry.path):
            if len(paths) == limit:
                return {"paths": paths, "truncated": True}
            paths.append(entry.path)
    return {"paths": paths, "truncated": False}


class SearchTool(ToolPlugin):
    name = "search-tool"
    version = 1

    def tools(self) -> list[ToolDefinition]:
        return [GREP, GLOB]

    def handlers(self) -> dict[str, Handler]:
        return {"search.grep": grep, "search.glob": glob}


PLUGIN = SearchTool()
