"""Lock files as data: the versions they pin and the sha256 of each file they allow.

``uv.lock``, ``poetry.lock`` and ``pdm.lock`` become *constraints* (``name==version``,
both checked by :func:`~fluffy.kernel.project.reqlines.pin`: a name such as
``pkg @ http://...#`` or one with a newline in it is refused, never written out);
``Pipfile.lock`` lists what to install, so its entries are requirements.  The hashes a lock
records (``sha256:...`` of each wheel and sdist) are kept per ``name==version``: a file
downloaded for that release must have one of them (:mod:`fluffy.images.environment`).
A package locked from git, a URL or a local path is never fetched and is named as refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from fluffy.kernel.project.files import read_text, read_toml, table
from fluffy.kernel.project.reqlines import (
    Refusal,
    constraint_line,
    line_of,
    pin,
    requirement_line,
    sha256_of,
    shown,
)

TOML_LOCKS = ("uv.lock", "poetry.lock", "pdm.lock")
LOCK_FILES = (*TOML_LOCKS, "Pipfile.lock")
#: A locked package with one of these keys (in itself or its ``source``) is not from an index.
_LOCAL_KEYS = ("editable", "virtual", "directory", "path", "git", "url")
_LOCAL_TYPES = ("directory", "git", "url", "file")


class Locked(msgspec.Struct):
    """What a lock file contributes."""

    name: str | None = None  # the lock file read
    constraints: list[str] = msgspec.field(default_factory=list)
    requirements: list[str] = msgspec.field(default_factory=list)
    #: ``name==version`` (canonical name) -> the sha256s the lock allows for its files
    hashes: dict[str, set[str]] = msgspec.field(default_factory=dict)
    refused: list[Refusal] = msgspec.field(default_factory=list)


def _file_hashes(entry: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    files = [entry.get("sdist"), *(entry.get("wheels") or []), *(entry.get("files") or [])]
    for item in files:
        if isinstance(item, dict) and (digest := sha256_of(item.get("hash"))):
            found.add(digest)
    return found


def _local(package: dict[str, Any]) -> bool:
    source = package.get("source")
    source = source if isinstance(source, dict) else {}
    return any(k in source or k in package for k in _LOCAL_KEYS) or (
        source.get("type") in _LOCAL_TYPES
    )


def _marker(package: dict[str, Any]) -> str | None:
    """When a locked version applies: Poetry's ``markers`` (a string, or one per group),
    PDM's ``marker``, uv's ``resolution-markers`` (any of them).  A lock may pin two
    versions of one package for different Pythons; without their markers the two pins
    contradict each other and nothing installs."""
    for key in ("markers", "marker", "resolution-markers"):
        value = package.get(key)
        items = [value] if isinstance(value, str) else value
        items = items.values() if isinstance(items, dict) else items
        parts = [v for v in items or () if isinstance(v, str)]
        if parts:
            return parts[0] if len(parts) == 1 else " or ".join(f"({p})" for p in parts)
    return None


def _toml_lock(root: Path, rel: str, own: str | None, out: Locked, notes: list[str]) -> bool:
    from packaging.utils import canonicalize_name

    data = read_toml(root, rel, notes)
    if data is None:
        return False
    text = read_text(root, rel) or ""
    legacy = table(data, "metadata", "files")  # poetry.lock before format 2
    for package in data.get("package") or []:
        if not isinstance(package, dict):
            continue
        name, version = package.get("name"), package.get("version")
        where = f"{rel}:{line_of(text, f'name = {json.dumps(name)}') or '?'}"
        if isinstance(name, str) and own is not None and canonicalize_name(name) == own:
            continue  # the project itself: installed from the tree
        if _local(package):
            out.refused.append(Refusal(where, shown(str(name)), "locked from git, a URL or a "
                                       "local path, not from the package index"))  # fmt: skip
            continue
        pinned = pin(name, version, where, out.refused)
        if pinned is None:
            continue
        marker = _marker(package)
        line = pinned if marker is None else constraint_line(f"{pinned}; {marker}", where,
                                                             out.refused)  # fmt: skip
        if line is None:
            continue
        out.constraints.append(line)
        hashes = _file_hashes(package)
        if isinstance(name, str):
            hashes |= _file_hashes({"files": legacy.get(name) or []})
        if hashes:
            out.hashes.setdefault(pinned, set()).update(hashes)
    out.name = rel
    return True


def _pipfile_lock(root: Path, out: Locked) -> bool:
    text = read_text(root, "Pipfile.lock")
    if text is None:
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    for section in ("default", "develop"):
        for name, entry in table(data, section).items():
            where = f"Pipfile.lock:{line_of(text, json.dumps(name)) or '?'}"
            if not isinstance(entry, dict) or not isinstance(entry.get("version"), str):
                out.refused.append(Refusal(where, shown(name), "not from the package index"))
                continue
            marker = entry.get("markers")
            line = f"{name}{entry['version']}" + (f"; {marker}" if isinstance(marker, str) else "")
            kept = requirement_line(line, where, out.refused)
            if kept is None:
                continue
            out.requirements.append(kept)
            hashes = {h for h in map(sha256_of, entry.get("hashes") or []) if h}
            pinned = pin(name, entry["version"].removeprefix("=="), where, [])
            if hashes and pinned:
                out.hashes.setdefault(pinned, set()).update(hashes)
    out.name = "Pipfile.lock"
    return True


def pipfile_lock(root: Path) -> Locked | None:
    """``Pipfile.lock``'s packages (requirements) and hashes; None without one."""
    out = Locked()
    return out if _pipfile_lock(root, out) else None


def toml_lock(root: Path, own_name: str | None, notes: list[str]) -> Locked | None:
    """The first of uv.lock, poetry.lock, pdm.lock present, as constraints and hashes."""
    from packaging.utils import canonicalize_name

    own = canonicalize_name(own_name) if own_name else None
    for rel in TOML_LOCKS:
        out = Locked()
        if _toml_lock(root, rel, own, out, notes):
            return out
    return None
