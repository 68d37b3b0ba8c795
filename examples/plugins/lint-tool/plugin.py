"""lint-tool: an example third-party fluffy plugin with one tool, ``lint.check``.

A small pure-Python linter over the project as the session sees it (the view: project
plus staged changes), read-only: unused imports (F401), lines longer than a limit
(E501) and trailing whitespace (W291).  It imports only the standard library and the
plugin SDK, like every plugin must; the kernel runs it in its own L2 sandbox.
"""

from __future__ import annotations

import ast
from typing import Any

from fluffy.plugins.sdk import Handler, ToolContext, ToolDefinition, ToolPlugin, normalise_path

MAX_FILES = 2000
MAX_FILE_BYTES = 1024 * 1024
MAX_PROBLEMS = 1000

CHECK = ToolDefinition(
    name="lint.check",
    description="Lint Python files of the project (as this session sees it): unused imports "
    "(F401), long lines (E501) and trailing whitespace (W291). Read-only.",
    input_schema={
        "type": "object",
        "properties": {
            "paths": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 4096},
                "maxItems": 100,
                "default": ["."],
                "description": "Files or folders relative to the project root.",
            },
            "max_line_length": {"type": "integer", "minimum": 40, "maximum": 400, "default": 100},
        },
        "additionalProperties": False,
    },
    output_mode="full",
    read_only=True,
    truncation="head",
    timeout_s=60,
)


def unused_imports(source: str) -> list[tuple[int, str]]:
    """(line, name) of each imported name the module never uses (``__all__`` counts)."""
    tree = ast.parse(source)
    imported: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported[(alias.asname or alias.name).split(".")[0]] = node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for alias in node.names:
                if alias.name != "*":
                    imported[alias.asname or alias.name] = node.lineno
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):  # names listed in __all__ are exported, so used
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            used.update(
                e.value
                for e in ast.walk(node.value)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return sorted((line, name) for name, line in imported.items() if name not in used)


def _problem(path: str, line: int, code: str, message: str) -> dict[str, Any]:
    return {"path": path, "line": line, "code": code, "message": message}


def lint_text(path: str, text: str, max_line_length: int) -> list[dict[str, Any]]:
    problems: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > max_line_length:
            message = f"line too long ({len(line)} > {max_line_length})"
            problems.append(_problem(path, number, "E501", message))
        if line != line.rstrip():
            problems.append(_problem(path, number, "W291", "trailing whitespace"))
    try:
        for number, name in unused_imports(text):
            problems.append(_problem(path, number, "F401", f"{name!r} imported but unused"))
    except SyntaxError as exc:
        problems.append(_problem(path, exc.lineno or 0, "E999", f"syntax error: {exc.msg}"))
    return problems


def check(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    files: dict[str, None] = {}  # ordered, without repeats
    for given in args["paths"]:
        rel = normalise_path(given, allow_root=True)
        if rel != "." and ctx.file_exists(rel):
            files[rel] = None
            continue
        for entry in ctx.walk(rel, skip=frozenset({".git", "__pycache__"})):
            if entry.link is None and entry.path.endswith(".py"):
                files[entry.path] = None
    problems: list[dict[str, Any]] = []
    checked = 0
    for path in list(files)[:MAX_FILES]:
        data = ctx.read_bytes(path)
        if len(data) > MAX_FILE_BYTES or b"\x00" in data[:8192]:
            continue
        checked += 1
        problems.extend(lint_text(path, data.decode("utf-8", "replace"), args["max_line_length"]))
    problems.sort(key=lambda p: (p["path"], p["line"], p["code"]))
    counts: dict[str, int] = {}
    for problem in problems:
        counts[problem["code"]] = counts.get(problem["code"], 0) + 1
    return {
        "files_checked": checked,
        "problem_count": len(problems),
        "counts": counts,
        "problems": problems[:MAX_PROBLEMS],
    }


class LintPlugin(ToolPlugin):
    name = "lint-tool"
    version = 1

    def tools(self) -> list[ToolDefinition]:
        return [CHECK]

    def handlers(self) -> dict[str, Handler]:
        return {"lint.check": check}


PLUGIN = LintPlugin()
