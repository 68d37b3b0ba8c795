"""Reading a project's own configuration files: bounded, never following links out.

Everything here reads files of the user's project (pyproject.toml, setup.cfg, pytest
settings, lock files).  The project may have been changed by a model, so a file is read
only when it is a regular file inside the project, at most :data:`MAX_CONFIG_BYTES`, and
a file that does not parse counts as absent (with a note saying so) rather than an error:
detection must never stop a kernel from starting.
"""

from __future__ import annotations

import configparser
import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

#: Largest configuration file read (a pyproject.toml is a few KiB; lock files are larger).
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def inside(root: Path, rel: str) -> bool:
    """Whether ``rel`` names a place inside ``root``: relative, no ``..``, and no folder on
    the way that is a link leading out (the file itself is opened ``O_NOFOLLOW``)."""
    if rel.startswith("/") or ".." in Path(rel).parts:
        return False
    real_root = os.path.realpath(root)
    parent = os.path.realpath((root / rel).parent)
    return parent == real_root or parent.startswith(real_root.rstrip(os.sep) + os.sep)


def read_text(root: Path, rel: str, limit: int = MAX_CONFIG_BYTES) -> str | None:
    """A regular file's text (UTF-8, replace), or None: absent, a link, too big, a folder,
    or not inside ``root``."""
    if not inside(root, rel):
        return None
    path = root / rel
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        return None
    return data.decode("utf-8", "replace")


def read_toml(root: Path, rel: str, notes: list[str] | None = None) -> dict[str, Any] | None:
    text = read_text(root, rel)
    if text is None:
        return None
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
        if notes is not None:
            notes.append(f"{rel} is not valid TOML ({str(exc)[:120]}); it was ignored")
        return None


def read_json(root: Path, rel: str, notes: list[str] | None = None) -> dict[str, Any] | None:
    """A JSON object file (anything else, or JSON that does not parse, counts as absent)."""
    text = read_text(root, rel)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        if notes is not None:
            notes.append(f"{rel} is not valid JSON ({str(exc)[:120]}); it was ignored")
        return None
    return data if isinstance(data, dict) else None


def is_folder(root: Path, rel: str) -> bool:
    """Whether ``rel`` is a folder of the project (not a link to one)."""
    path = root / rel
    return path.is_dir() and not path.is_symlink()


def read_ini(
    root: Path, rel: str, notes: list[str] | None = None
) -> configparser.ConfigParser | None:
    text = read_text(root, rel)
    if text is None:
        return None
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text, source=rel)
    except (configparser.Error, ValueError) as exc:
        if notes is not None:
            notes.append(f"{rel} could not be read as INI ({str(exc)[:120]}); it was ignored")
        return None
    return parser


def table(data: Any, *keys: str) -> dict[str, Any]:
    """``data[k1][k2]...`` when every step is a table, else ``{}``."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


def strings(value: Any) -> list[str]:
    """A string or a list of strings as a list (anything else: empty)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    return []


def ini_list(value: str | None) -> list[str]:
    """An INI multi-value (newlines or commas / spaces) as a list."""
    if not value:
        return []
    out: list[str] = []
    for line in value.replace(",", "\n").splitlines():
        out.extend(part for part in line.split() if part and not part.startswith("#"))
    return out
