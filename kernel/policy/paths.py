"""Normalising request paths against the project root (before any rule sees them)."""

from __future__ import annotations

import posixpath
from pathlib import Path, PurePosixPath


class PathEscape(ValueError):
    """The path leaves the project (``..``, an absolute path elsewhere, a symlink)."""


def normalize(path: str, root: Path | None) -> str:
    """``path`` relative to the project root, '/'-separated, or :class:`PathEscape`.

    Lexical first (``..`` may not climb above the root), then, when the root exists on
    this machine, symlinks are resolved and must stay inside it.
    """
    if not path or "\x00" in path:
        raise PathEscape(f"{path!r} is not a path")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        if root is None:
            raise PathEscape(f"absolute path {path} with no project root to confine it")
        try:
            pure = pure.relative_to(PurePosixPath(root.as_posix()))
        except ValueError:
            raise PathEscape(f"{path} is outside the project {root}") from None
    parts: list[str] = []
    for part in pure.parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise PathEscape(f"{path} climbs out of the project with '..'")
            parts.pop()
            continue
        parts.append(part)
    relative = posixpath.join(*parts) if parts else "."
    if root is not None and root.exists():
        resolved = (root / relative).resolve()
        try:
            resolved.relative_to(root.resolve())
        except ValueError:
            raise PathEscape(f"{path} leads outside the project through a symlink") from None
    return relative
