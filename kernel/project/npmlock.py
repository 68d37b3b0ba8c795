"""A JavaScript project's lock file, read as data: which packages, from where, laid where.

Three lock files are read (nothing of the project runs, ADR-072):

* ``package-lock.json`` / ``npm-shrinkwrap.json`` v2 and v3: ``packages`` names each
  install path (``node_modules/a/node_modules/b``), so the tree is laid exactly as npm
  would lay it (:attr:`NodeLock.placed`);
* ``pnpm-lock.yaml`` v6 and v9: the resolved graph (importers, packages, snapshots) is
  laid out the way pnpm does, isolated (:attr:`NodeLock.roots` and each package's
  ``deps``);
* ``yarn.lock`` v1: entries keyed by ``name@range``, laid out isolated too.

Only packages of the npm registry are fetched, by name and version from the registry
fluffy is configured with (never a URL the repository wrote), and only with the lock's
``integrity`` to check the download against.  Git, URL, file and directory dependencies
are *refused* with their reason; packages for another platform (``os``/``cpu``/``libc``)
are *skipped*.  Workspace packages are links to the project's own folders.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fluffy.errors import EnvironmentFailed
from fluffy.kernel.project.files import read_text

#: Lock files, in the order they are looked for.
NODE_LOCKS = ("package-lock.json", "npm-shrinkwrap.json", "pnpm-lock.yaml", "yarn.lock")
MAX_LOCK_BYTES = 64 * 1024 * 1024
MAX_PACKAGES = 20_000
#: An npm package name (old packages may have capitals).
_NAME = re.compile(r"^(?:@[A-Za-z0-9][\w.~-]*/)?[A-Za-z0-9_][\w.~-]*$")
_VERSION = re.compile(r"^\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.+-]*)?$")
_INTEGRITY = re.compile(r"^(sha512|sha384|sha256|sha1)-[A-Za-z0-9+/]+={0,2}$")
#: The image's platform, in npm's words.
PLATFORM = {"os": "linux", "libc": "glibc"}
CPU = {"x86_64": "x64", "aarch64": "arm64"}


@dataclass(frozen=True)
class NodePackage:
    """One package to fetch (by name and version) and check (by integrity)."""

    key: str
    name: str
    version: str
    integrity: str
    #: isolated layouts: dependency name -> key of the package it resolves to
    deps: dict[str, str] = field(default_factory=dict)

    def tarball(self, registry: str) -> str:
        """The package's archive in ``registry`` (npm's own naming)."""
        base = self.name.rsplit("/", 1)[-1]
        return f"{registry.rstrip('/')}/{self.name}/-/{base}-{self.version}.tgz"


@dataclass
class NodeLock:
    """What a lock file says to install (see the module docstring)."""

    file: str
    layout: str  # "tree" (npm) or "isolated" (pnpm, yarn)
    packages: dict[str, NodePackage] = field(default_factory=dict)
    #: tree: install path under node_modules -> package key
    placed: dict[str, str] = field(default_factory=dict)
    #: isolated: a top-level dependency's name -> package key
    roots: dict[str, str] = field(default_factory=dict)
    #: node_modules path (name) -> the workspace folder it links to (project-relative)
    links: dict[str, str] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: packages the lock says have an install script (none is run)
    scripted: list[str] = field(default_factory=list)

    def to_plan(self) -> dict[str, Any]:
        """The build's plan (plain JSON)."""
        return {
            "layout": self.layout,
            "packages": {k: {"name": p.name, "version": p.version, "deps": p.deps}
                         for k, p in sorted(self.packages.items())},
            "placed": dict(sorted(self.placed.items())),
            "roots": dict(sorted(self.roots.items())),
            "links": dict(sorted(self.links.items())),
        }  # fmt: skip


def _fits(entry: dict[str, Any], arch: str) -> bool:
    """Whether an entry's ``os``/``cpu``/``libc`` allow the image's platform."""
    wanted = {"os": PLATFORM["os"], "cpu": CPU.get(arch, arch), "libc": PLATFORM["libc"]}
    for key, value in wanted.items():
        allowed = entry.get(key)
        if isinstance(allowed, str):
            allowed = [allowed]
        if not isinstance(allowed, list) or not allowed:
            continue
        names = [str(a) for a in allowed]
        listed = any(not n.startswith("!") for n in names)
        if f"!{value}" in names or (listed and value not in names):
            return False
    return True


def _safe_folder(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _add(lock: NodeLock, name: str, version: str, integrity: Any, where: str) -> str | None:
    """The package's key once checked, or None (refused, with the reason noted)."""
    if not _NAME.match(name) or len(name) > 214:
        lock.refused.append(f"{where}: {name[:80]!r} is not an npm package name")
        return None
    if not _VERSION.match(version):
        lock.refused.append(f"{where}: {name}@{version[:80]} is not a registry version "
                            "(git, URL and file dependencies are not fetched)")  # fmt: skip
        return None
    if not isinstance(integrity, str) or not _INTEGRITY.match(integrity.split()[0]):
        lock.refused.append(f"{where}: {name}@{version} has no integrity in the lock, so "
                            "its download could not be checked")  # fmt: skip
        return None
    key = f"{name}@{version}"
    if key not in lock.packages and len(lock.packages) >= MAX_PACKAGES:
        raise EnvironmentFailed(
            f"{lock.file} names more than {MAX_PACKAGES} packages",
            why="fluffy lays at most that many into a test environment",
            fix="Trim the project's dependencies, or run its tests outside fluffy.",
        )
    lock.packages.setdefault(key, NodePackage(key, name, version, integrity.split()[0]))
    return key


# -- npm: package-lock.json v2/v3 ---------------------------------------------------------
def _npm(data: Any, file: str, arch: str) -> NodeLock:
    lock = NodeLock(file, "tree")
    packages = data.get("packages") if isinstance(data, dict) else None
    if not isinstance(packages, dict):
        raise EnvironmentFailed(
            f"{file} is a version 1 lock (no `packages`), which fluffy does not read",
            why="lock files of npm 6 and older list a nested tree fluffy does not lay out",
            fix="Update the lock with npm 7 or later: `npm install --package-lock-only`.",
        )
    for path, entry in packages.items():
        if path == "" or not isinstance(entry, dict) or not isinstance(path, str):
            continue
        if not path.startswith("node_modules/"):
            if "/node_modules/" in path:
                lock.skipped.append(f"{path}: installed in a workspace's own node_modules "
                                    "(fluffy lays the top-level node_modules only)")  # fmt: skip
            continue  # a workspace package's own entry: it is the project's folder
        rel = path[len("node_modules/") :]
        name = str(entry.get("name") or rel.rsplit("node_modules/", 1)[-1])
        if entry.get("link"):
            target = str(entry.get("resolved", ""))
            if _safe_folder(target) and "/node_modules/" not in f"/{rel}/":
                lock.links[rel] = target
            else:
                lock.refused.append(f"{path}: a link to {target[:80]!r}, outside the project")
            continue
        if not _fits(entry, arch):
            lock.skipped.append(f"{path}: for another platform")
            continue
        resolved = str(entry.get("resolved", ""))
        if resolved and not resolved.startswith(("https://", "http://")):
            lock.refused.append(f"{path}: {resolved[:80]} is not a registry download")
            continue
        if not all(_NAME.match(p) for p in rel.split("/node_modules/")):
            lock.refused.append(f"{path}: not an install path of npm packages")
            continue
        key = _add(lock, name, str(entry.get("version", "")), entry.get("integrity"), path)
        if key is not None:
            lock.placed[rel] = key
            if entry.get("hasInstallScript"):
                lock.scripted.append(key)
    return lock


# -- pnpm: pnpm-lock.yaml v6/v9 -----------------------------------------------------------
def _split_key(key: str) -> tuple[str, str]:
    """``name@version(peers)`` (v9) or ``/name@version(peers)`` (v6) -> (name, version)."""
    bare = key.lstrip("/").split("(", 1)[0]
    at = bare.rfind("@")
    return (bare[:at], bare[at + 1 :]) if at > 0 else (bare, "")


def _pnpm_target(name: str, value: Any) -> str:
    """The snapshot key a dependency's value names (``1.2.3(peer@1)``, or an alias
    ``real@1.2.3``)."""
    text = str(value.get("version") if isinstance(value, dict) else value)
    if text[:1].isdigit():
        return f"{name}@{text}"
    return text.lstrip("/")


def _pnpm(data: Any, file: str, arch: str) -> NodeLock:
    lock = NodeLock(file, "isolated")
    version = str(data.get("lockfileVersion", "")) if isinstance(data, dict) else ""
    if not version.startswith(("6", "9")):
        raise EnvironmentFailed(
            f"{file} is a version {version[:20] or '?'} pnpm lock, which fluffy does not read",
            why="fluffy reads pnpm lock files of versions 6 and 9",
            fix="Update the lock with pnpm 8 or later: `pnpm install --lockfile-only`.",
        )
    packages = data.get("packages") or {}
    snapshots = data.get("snapshots") if version.startswith("9") else packages
    if not isinstance(packages, dict) or not isinstance(snapshots, dict):
        raise EnvironmentFailed(f"{file}: `packages` is not a mapping",
                                fix="Regenerate it: `pnpm install --lockfile-only`.")  # fmt: skip
    keys: dict[str, str | None] = {}  # snapshot -> package key (None: not installed)

    def entry(table: dict[str, Any], snapshot: str) -> dict[str, Any]:
        for name in (snapshot, f"/{snapshot}", snapshot.split("(", 1)[0]):
            found = table.get(name)
            if isinstance(found, dict):
                return found
        return {}

    def package(snapshot: str) -> str | None:
        if snapshot not in keys:
            name, ver = _split_key(snapshot)
            meta = entry(packages, snapshot)
            resolution = meta.get("resolution")
            keys[snapshot] = None
            if not isinstance(resolution, dict) or "integrity" not in resolution:
                lock.refused.append(f"{snapshot[:120]}: not from the registry (git, tarball "
                                    "URL and folder dependencies are not fetched)")  # fmt: skip
            elif not _fits(meta, arch):
                lock.skipped.append(f"{snapshot[:120]}: for another platform")
            else:
                keys[snapshot] = _add(lock, str(meta.get("name") or name), ver,
                                      resolution.get("integrity"), snapshot[:120])  # fmt: skip
                if keys[snapshot] is not None and meta.get("requiresBuild"):
                    lock.scripted.append(str(keys[snapshot]))
        return keys[snapshot]

    importers = data.get("importers") or {".": data}
    for where, importer in sorted(importers.items(), key=lambda kv: kv[0] != "."):
        for dep, value in _groups(importer, ("dependencies", "devDependencies",
                                             "optionalDependencies")):  # fmt: skip
            text = str(value.get("version") if isinstance(value, dict) else value)
            if text.startswith("link:"):
                target = _join(str(where), text[len("link:") :])
                if target is not None and _NAME.match(dep):
                    lock.links.setdefault(dep, target)
                continue
            key = package(_pnpm_target(dep, value))
            if key is not None:
                lock.roots.setdefault(dep, key)
    done: set[str] = set()
    while todo := [s for s, k in keys.items() if k is not None and s not in done]:
        for snapshot in todo:
            done.add(snapshot)
            owner = lock.packages[str(keys[snapshot])]
            for dep, value in _groups(entry(snapshots, snapshot),
                                      ("dependencies", "optionalDependencies")):  # fmt: skip
                if not str(value).startswith("link:"):
                    target = package(_pnpm_target(dep, value))
                    if target is not None:
                        owner.deps.setdefault(dep, target)
    return lock


def _groups(table: Any, groups: tuple[str, ...]) -> list[tuple[str, Any]]:
    """(name, value) of each dependency in ``table``'s ``groups``."""
    found: list[tuple[str, Any]] = []
    for group in groups:
        deps = table.get(group) if isinstance(table, dict) else None
        if isinstance(deps, dict):
            found += [(str(name), value) for name, value in deps.items()]
    return found


def _join(base: str, rel: str) -> str | None:
    """``rel`` (a link's target) from the importer folder ``base``, inside the project."""
    parts = [] if base in ("", ".") else base.split("/")
    for part in rel.split("/"):
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    joined = "/".join(parts)
    return joined if _safe_folder(joined) else None


# -- yarn v1 ------------------------------------------------------------------------------
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


def _yarn(text: str, file: str, manifest: dict[str, Any]) -> NodeLock:
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
            at = spec.find("@", 1)
            name = spec[:at] if at > 0 else spec
            resolved = str(entry.get("resolved", ""))
            keys[id(entry)] = None
            if resolved and not resolved.startswith(("https://", "http://")):
                lock.refused.append(f"{spec[:120]}: {resolved[:80]} is not a registry download")
            else:
                key = _add(lock, name, str(entry.get("version", "")), entry.get("integrity"),
                           spec[:120])  # fmt: skip
                keys[id(entry)] = key
                if key is not None:
                    entry_of[key] = entry
        return keys[id(entry)]

    for dep, wanted in _groups(manifest, ("dependencies", "devDependencies",
                                          "optionalDependencies")):  # fmt: skip
        if not str(wanted).startswith(("workspace:", "file:", "link:", "portal:")):
            key = package(f"{dep}@{wanted}")
            if key is not None:
                lock.roots.setdefault(dep, key)
    todo, done = list(lock.roots.values()), set()
    while todo:
        key = todo.pop()
        if key in done:
            continue
        done.add(key)
        for dep, wanted in entry_of[key]["dependencies"].items():
            target = package(f"{dep}@{wanted}")
            if target is not None:
                lock.packages[key].deps.setdefault(dep, target)
                todo.append(target)
    return lock


def read_node_lock(root: Path, manifest: dict[str, Any], arch: str) -> NodeLock | None:
    """The project's lock file as :class:`NodeLock`; None when it has none.  A lock that
    cannot be read raises :class:`EnvironmentFailed` saying why and what to do."""
    for name in NODE_LOCKS:
        text = read_text(root, name, MAX_LOCK_BYTES)
        if text is None:
            continue
        try:
            if name.endswith(".json"):
                return _npm(json.loads(text), name, arch)
            if name == "pnpm-lock.yaml":
                return _pnpm(yaml.safe_load(text), name, arch)
            return _yarn(text, name, manifest)
        except (ValueError, yaml.YAMLError) as exc:
            raise EnvironmentFailed(
                f"{name} cannot be read",
                why=f"it is not valid {'JSON' if name.endswith('.json') else 'YAML'}: "
                f"{str(exc)[:300]}",
                fix=f"Regenerate {name} with its package manager.",
            ) from None
    return None
