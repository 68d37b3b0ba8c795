"""A private copy of the view for a test run (tests may write where they run).

Tool caches, virtual environments and ``.git`` stay out; symbolic links are copied as
links only when they resolve inside the copy, else left out; nothing is followed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fluffy.plugins.sdk import ToolContext, link_stays_inside

SKIP = frozenset(
    {
        ".git",
        ".venv",
        "venv",
        "node_modules",
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".fluffy",
    }
)


def copy_view(ctx: ToolContext, target: Path) -> int:
    """Copy the view into ``target`` (created); the number of files and links copied."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    real_target = os.path.realpath(target)
    copied = 0
    for entry in ctx.walk(".", SKIP):
        dest = target / entry.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        real_parent = os.path.realpath(dest.parent)
        if real_parent != real_target and not real_parent.startswith(real_target + os.sep):
            continue  # under a link copied earlier: never write through it
        if entry.link is not None:
            if link_stays_inside(entry.path, entry.link):
                dest.symlink_to(entry.link)
                copied += 1
            continue
        shutil.copyfile(entry.source, dest, follow_symlinks=False)
        dest.chmod((entry.source.stat().st_mode & 0o755) | 0o600)
        copied += 1
    return copied
