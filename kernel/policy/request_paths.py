"""Normalising request paths against the project root (before any rule sees them)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path, PurePosixPath

from fluffy.pathnames import is_utf8, shown


class PathEscape(ValueError):
    """The path leaves the project (``..``, an absolute path elsewhere, a symlink)."""


def normalize(path: str, root: Path | None) -> str:
    """``path`` relative to the project root, '/'-separated, or :class:`PathEscape`.

    Lexical first (``..`` may not climb above the root), then, when the root exists on
    this machine, symlinks are resolved, must stay inside it, and the *resolved* path is
    what the rules see (a link named ``src/x`` to ``.fluffy/policy.yaml`` is the policy).
    """
    if not path or "\x00" in path or not is_utf8(path):
        raise PathEscape(f"{shown(path)!r} is not a path (file names here are UTF-8 text)")
    if path.startswith("/"):
        if root is None:
            raise PathEscape(f"absolute path {path} with no project root to confine it")
        try:
            text = str(PurePosixPath(path).relative_to(PurePosixPath(root.as_posix())))
        except ValueError:
            raise PathEscape(f"{path} is outside the project {root}") from None
    else:
        text = path
    parts: list[str] = []
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise PathEscape(f"{path} climbs out of the project with '..'")
            parts.pop()
            continue
        parts.append(part)
    relative = "/".join(parts) if parts else "."
    if root is not None:
        base = _real_root(str(root))
        if base is None:
            return relative
        try:
            resolved = _resolve(base, parts)
        except (OSError, RuntimeError) as exc:  # a symlink loop, among others
            raise PathEscape(f"{path} cannot be resolved: {exc}") from None
        if resolved == base:
            return "."
        if not resolved.startswith(base + os.sep):
            raise PathEscape(f"{path} leads outside the project through a symlink")
        inside = resolved[len(base) + 1 :]
        if not is_utf8(inside):  # a link to a name no tool can carry
            raise PathEscape(f"{path} leads to {shown(inside)}, a name that is not UTF-8")
        # Rules judge what the path really is, not the name of a link to it.
        return inside
    return relative


def _resolve(base: str, parts: list[str]) -> str:
    """``Path(base, *parts).resolve()`` for a ``base`` already resolved, parts free of
    ``.``/``..``: one ``lstat`` per part below the base (not per part of the whole
    path, in Python), and the full resolution only when a part is a symlink."""
    current = base.rstrip("/")  # the root directory itself: "", so "/part"
    for index, part in enumerate(parts):
        current = f"{current}/{part}"
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:  # nothing below a missing part can be a link
            return "/".join((current, *parts[index + 1 :]))
        except OSError:
            break
        if stat.S_ISLNK(mode):
            break
    else:
        return current or "/"
    return str(Path(base, *parts).resolve())


def _real_root(root: str) -> str | None:
    """The project root with its own symlinks resolved (None: it does not exist here).

    Cached briefly: the root is resolved once per burst of calls, not per path (a root
    replaced by a link is seen within a second)."""
    now = time.monotonic()
    hit = _ROOTS.get(root)
    if hit is not None and now - hit[1] < 1.0:
        return hit[0]
    real = os.path.realpath(root) if Path(root).is_dir() else None
    _ROOTS[root] = (real, now)
    return real


_ROOTS: dict[str, tuple[str | None, float]] = {}
