"""Helpers of the built-in tool plugins' tests: a call against temp folders standing in
for the sandbox's mounts, its answer, and the folders' state."""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
from pathlib import Path
from typing import Any

from fluffy.plugins.sdk import Roots, ToolPlugin, check_plugin, execute_job, scrubbed


def plugin_of(module: str) -> ToolPlugin:
    plugin: ToolPlugin = importlib.import_module(f"fluffy.plugins.{module}").PLUGIN
    return plugin


def call(
    roots: Roots,
    tool: str,
    args: dict[str, Any],
    call_id: str = "c1",
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    module = {"fs": "fs_tool", "search": "search_tool", "git": "git_tool", "test": "test_tool",
              "container": "container_tool"}  # fmt: skip
    plugin = plugin_of(module[tool.split(".")[0]])
    job = {"call_id": call_id, "tool": tool, "args": args, "session_mode": "strict"}
    if settings is not None:
        job["settings"] = settings
    reply: dict[str, Any] = execute_job(
        check_plugin(plugin), plugin.name, job, roots, env=scrubbed(os.environ)
    )
    assert reply["call_id"] == call_id
    return reply


def ok(reply: dict[str, Any]) -> dict[str, Any]:
    assert reply["ok"] is True, reply
    result: dict[str, Any] = reply["result"]
    return result


def error(reply: dict[str, Any], code: str) -> str:
    assert reply["ok"] is False and reply["error"]["code"] == code, reply
    message: str = reply["error"]["message"]
    return message


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``folder`` (``.git`` included): mtime and content hash."""
    found: dict[str, tuple[int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            info = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            found[str(path.relative_to(folder))] = (info.st_mtime_ns, digest)
    return found


def git(repo: Path, *args: str, **env: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        env={"PATH": os.environ["PATH"], "HOME": str(repo.parent), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout
