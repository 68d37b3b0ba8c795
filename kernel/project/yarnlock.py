"""yarn.lock v1, read as data (:mod:`fluffy.kernel.project.npmlock` says what for).

Each entry is keyed by the ``name@range`` specs that resolve to it; the project's
dependencies and its workspace packages' (``package.json`` ``workspaces``) are looked up
by their spec, and every entry reached is laid out isolated.  yarn v1 records no
``os``/``cpu``, so packages for other platforms are fetched too (and never loaded).
"""

from __future__ import annotations

from typing import Any

from fluffy.errors import EnvironmentFailed
from fluffy.kernel.project.npmlock import (
    NodeLock,
    add_package,
    dependency_groups,
    is_package_name,
    registry_download,
)


def _yarn_entries(text: str) -> dict[str, dict[str, Any]]:
    """yarn.lock v1's entries: each ``name@range`` -> {version, resolved, integrity,
    dependencies}."""
    entries: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    in_deps = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        if indent == 0:
            current, in_deps = {"dependencies": {}}, False
            for spec in line.rstrip(":").split(","):
                entries[spec.strip().strip('"')] = current
        elif current is not None and indent == 2:
            in_deps = line in ("dependencies:", "optionalDependencies:")
            key, _, value = line.partition(" ")
            if not line.endswith(":"):
                current[key.strip('"')] = value.strip().strip('"')
        elif current is not None and in_deps:
            key, _, value = line.partition(" ")
            current["dependencies"][key.strip('"')] = value.strip().strip('"')
    return entries


def _yarn_name(spec: str) -> str:
    """The package a yarn entry's ``name@range`` installs (``a@npm:b@^1``: ``b``)."""
    at = spec.find("@", 1)
    name, wanted = (spec[:at], spec[at + 1 :]) if at > 0 else (spec, "")
    if wanted.startswith("npm:"):
        real = wanted[len("npm:") :]
        cut = real.rfind("@")
        return real[:cut] if cut > 0 else real
    return name


def read_yarn(
    text: str, file: str, manifest: dict[str, Any], workspaces: list[tuple[str, dict[str, Any]]]
) -> NodeLock:
    lock = NodeLock(file, "isolated")
    if "__metadata:" in text:
        raise EnvironmentFailed(
            f"{file} is a Yarn 2+ (Berry) lock, which fluffy does not read yet",
            why="Berry records its own archive checksums, not the npm registry's integrity, "
            "so fluffy could not check what it downloads",
            fix="Add a package-lock.json beside it (`npm install --package-lock-only`), or "
            "run the tests outside fluffy.",
        )
    entries = _yarn_entries(text)
    keys: dict[int, str | None] = {}
    entry_of: dict[str, dict[str, Any]] = {}

    def package(spec: str) -> str | None:
        entry = entries.get(spec)
        if entry is None:
            lock.refused.append(f"{spec[:120]}: not in {file}")
            return None
        if id(entry) not in keys:
            name = _yarn_name(spec)
            version = str(entry.get("version", ""))
            resolved = str(entry.get("resolved", "")).split("#", 1)[0]
            keys[id(entry)] = None
            if resolved and not registry_download(resolved, name, version):
                lock.refused.append(f"{spec[:120]}: {resolved[:100]} is not a registry download "
                                    "(URL, git and file dependencies are not fetched)")  # fmt: skip
            else:
                key = add_package(lock, name, version, entry.get("integrity"), spec[:120])
                keys[id(entry)] = key
                if key is not None:
                    entry_of[key] = entry
        return keys[id(entry)]

    for where, own in [(".", manifest), *workspaces]:
        for dep, wanted in dependency_groups(own, ("dependencies", "devDependencies",
                                         "optionalDependencies")):  # fmt: skip
            if str(wanted).startswith(("workspace:", "file:", "link:", "portal:")):
                continue
            key = package(f"{dep}@{wanted}")
            if key is not None and lock.roots.setdefault(dep, key) != key:
                lock.skipped.append(f"{where}: {dep} {key} (the top level has "
                                    f"{lock.roots[dep]}; workspace packages share it)")  # fmt: skip
        name = own.get("name")
        if where != "." and isinstance(name, str) and is_package_name(name):
            lock.links.setdefault(name, where)
    todo, done = list(lock.roots.values()), set()
    while todo:
        key = todo.pop()
        if key in done:
            continue
        done.add(key)
        for dep, wanted in dependency_groups(entry_of[key], ("dependencies",)):
            target = package(f"{dep}@{wanted}")
            if target is not None:
                lock.packages[key].deps.setdefault(dep, target)
                todo.append(target)
    return lock
