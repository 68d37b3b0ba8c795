"""Running git against the read-only project, and reading its answers.

Every command runs with ``GIT_DIR=/workspace/.git`` and ``GIT_WORK_TREE=/workspace``
(the project belongs to another uid: ``-c safe.directory=*``), no system or user
configuration, ``HOME=/tmp``, ``GIT_OPTIONAL_LOCKS=0``, and with the repository's
executable hooks switched off (fsmonitor, hooks, external diff, textconv, signing).
The tools point ``GIT_INDEX_FILE`` and ``GIT_OBJECT_DIRECTORY`` into the call's output
wherever git could write (a stat refresh of the index, new objects): git writes nothing
under the project.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fluffy.errors import ToolFailed
from fluffy.plugins.sdk import RunResult, ToolContext

GIT = "git"
#: Configuration given on the command line (the only configuration git trusts here).
SAFE_CONFIG = (
    "safe.directory=*",
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.quotePath=false",
    "color.ui=false",
    "gc.auto=0",
    "maintenance.auto=false",
)


def git_env(ctx: ToolContext) -> dict[str, str]:
    workspace = ctx.workspace
    return {
        "GIT_DIR": str(workspace / ".git"),
        "GIT_WORK_TREE": str(workspace),
        "GIT_OPTIONAL_LOCKS": "0",
        # paths are file names, never pathspec magic (`:!x`, `:(glob)`) or globs
        "GIT_LITERAL_PATHSPECS": "1",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PAGER": "cat",
        "HOME": "/tmp",  # noqa: S108 - the sandbox's scratch space; no user config there
        "LC_ALL": "C",
    }


def require_repository(ctx: ToolContext) -> None:
    if not (ctx.workspace / ".git").is_dir():
        raise ToolFailed(
            "the project is not a git repository (it has no .git folder)",
            why="the git tools work on the project's own repository",
            fix="Run `git init` in the project on the host first.",
        )


def git(
    ctx: ToolContext,
    *args: str,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
    cwd: Path | None = None,
) -> RunResult:
    """``git <args>`` in the project; ToolFailed when it fails and ``check`` is set."""
    command = [GIT, "--no-pager"]
    for setting in SAFE_CONFIG:
        command += ["-c", setting]
    result = ctx.run(
        [*command, *args],
        cwd=ctx.workspace if cwd is None else cwd,
        env={**git_env(ctx), **(env or {})},
        input=input,
    )
    if check and not result.ok:
        detail = (result.stderr or result.stdout).strip()[-2000:]
        raise ToolFailed(
            f"git {args[0]} failed (exit {result.exit_code}): {detail}",
            why="git refused the operation on the project's repository",
            fix="Read git's message above; the repository may need fixing on the host.",
        )
    return result


def optional(ctx: ToolContext, *args: str, env: Mapping[str, str] | None = None) -> str | None:
    """The output of a git query that may legitimately find nothing (None then)."""
    result = git(ctx, *args, env=env, check=False)
    value = result.stdout.strip()
    return value if result.ok and value else None


def parse_status(output: str) -> list[dict[str, Any]]:
    """``git status --porcelain=v1 -z`` as ``[{"path", "status"[, "orig_path"]}]``."""
    records = output.split("\0")
    entries: list[dict[str, Any]] = []
    i = 0
    while i < len(records):
        record = records[i]
        i += 1
        if len(record) < 4:
            continue
        code, path = record[:2], record[3:]
        entry: dict[str, Any] = {"path": path, "status": code}
        if "R" in code or "C" in code:  # a rename or copy: the source path follows
            if i < len(records):
                entry["orig_path"] = records[i]
            i += 1
        entries.append(entry)
    return entries
