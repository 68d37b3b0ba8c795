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

import base64
import re
import urllib.parse
from typing import Any

import msgspec

from fluffy.errors import EnvironmentFailed

#: Lock files, in the order they are looked for.
NODE_LOCKS = ("pnpm-lock.yaml", "yarn.lock", "npm-shrinkwrap.json", "package-lock.json")
MAX_LOCK_BYTES = 64 * 1024 * 1024
MAX_PACKAGES = 20_000
#: An npm package name (old packages may have capitals).
_NAME = re.compile(r"(?:@[A-Za-z0-9][\w.~-]*/)?[A-Za-z0-9_][\w.~-]*")
_VERSION = re.compile(r"\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.+-]*)?")
#: An integrity's algorithm and the length of its digest, in bytes.
_DIGESTS = {"sha512": 64, "sha384": 48, "sha256": 32, "sha1": 20}
#: The image's platform, in npm's words.
PLATFORM = {"os": "linux", "libc": "glibc"}
CPU = {"x86_64": "x64", "aarch64": "arm64"}


class NodePackage(msgspec.Struct, frozen=True):
    """One package to fetch (by name and version) and check (by integrity)."""

    key: str
    name: str
    version: str
    integrity: str
    #: isolated layouts: dependency name -> key of the package it resolves to
    deps: dict[str, str] = msgspec.field(default_factory=dict)

    def tarball(self, registry: str) -> str:
        """The package's archive in ``registry`` (npm's own naming)."""
        base = self.name.rsplit("/", 1)[-1]
        return f"{registry.rstrip('/')}/{self.name}/-/{base}-{self.version}.tgz"


class NodeLock(msgspec.Struct):
    """What a lock file says to install (see the module docstring)."""

    file: str
    layout: str  # "tree" (npm) or "isolated" (pnpm, yarn)
    packages: dict[str, NodePackage] = msgspec.field(default_factory=dict)
    #: tree: install path under node_modules -> package key
    placed: dict[str, str] = msgspec.field(default_factory=dict)
    #: isolated: a top-level dependency's name -> package key
    roots: dict[str, str] = msgspec.field(default_factory=dict)
    #: node_modules path (name) -> the workspace folder it links to (project-relative)
    links: dict[str, str] = msgspec.field(default_factory=dict)
    refused: list[str] = msgspec.field(default_factory=list)
    skipped: list[str] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)

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


def is_package_name(name: str) -> bool:
    return len(name) <= 214 and _NAME.fullmatch(name) is not None


def checked_integrity(value: Any) -> str | None:
    """The lock's integrity (its first, SRI-style ``algorithm-base64``) when it is a
    well-formed digest of a known algorithm; None otherwise."""
    first = value.split()[0] if isinstance(value, str) and value.split() else ""
    algorithm, _, digest = first.partition("-")
    try:
        raw = base64.b64decode(digest, validate=True)
    except ValueError:
        return None
    return first if len(raw) == _DIGESTS.get(algorithm, -1) else None


def registry_download(resolved: str, name: str, version: str) -> bool:
    """Whether a lock's ``resolved`` URL is a registry's archive of ``name@version`` (any
    host: the download itself comes from fluffy's registry), not another URL."""
    path = urllib.parse.urlsplit(resolved).path
    base = name.rsplit("/", 1)[-1]
    return resolved.startswith(("https://", "http://")) and (
        path.endswith(f"/{name}/-/{base}-{version}.tgz")
        or path.endswith(f"/{name.replace('/', '%2f')}/-/{base}-{version}.tgz")
    )


def _safe_folder(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def add_package(
    lock: NodeLock, name: str, version: str, integrity: Any, where: str, key: str = ""
) -> str | None:
    """The package's key (``key``, else ``name@version``) once checked, or None (refused,
    with the reason noted)."""
    if not is_package_name(name):
        lock.refused.append(f"{where}: {name[:80]!r} is not an npm package name")
        return None
    if _VERSION.fullmatch(version) is None:
        lock.refused.append(f"{where}: {name}@{version[:80]!r} is not a registry version "
                            "(git, URL and file dependencies are not fetched)")  # fmt: skip
        return None
    checked = checked_integrity(integrity)
    if checked is None:
        lock.refused.append(f"{where}: {name}@{version} has no well-formed integrity in the "
                            "lock, so its download could not be checked")  # fmt: skip
        return None
    key = key or f"{name}@{version}"
    if key not in lock.packages and len(lock.packages) >= MAX_PACKAGES:
        raise EnvironmentFailed(
            f"{lock.file} names more than {MAX_PACKAGES} packages",
            why="fluffy lays at most that many into a test environment",
            fix="Trim the project's dependencies, or run its tests outside fluffy.",
        )
    lock.packages.setdefault(key, NodePackage(key, name, version, checked))
    return key


# -- npm: package-lock.json v2/v3 ---------------------------------------------------------
def read_npm(data: Any, file: str, arch: str) -> NodeLock:
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
        if not all(is_package_name(p) for p in rel.split("/node_modules/")):
            lock.refused.append(f"{path[:120]!r}: not an install path of npm packages")
            continue
        if entry.get("inBundle"):
            continue  # it comes inside its parent's archive
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
        version = str(entry.get("version", ""))
        resolved = str(entry.get("resolved", ""))
        if resolved and not registry_download(resolved, name, version):
            lock.refused.append(f"{path}: {resolved[:100]} is not a registry download "
                                "(URL, git and file dependencies are not fetched)")  # fmt: skip
            continue
        key = add_package(lock, name, version, entry.get("integrity"), path)
        if key is not None:
            lock.placed[rel] = key
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


def read_pnpm(data: Any, file: str, arch: str) -> NodeLock:
    lock = NodeLock(file, "isolated")
    version = str(data.get("lockfileVersion", "")) if isinstance(data, dict) else ""
    if not version.startswith(("6", "9")):
        raise EnvironmentFailed(
            f"{file} is a version {version[:20] or '?'} pnpm lock, which fluffy does not read",
            why="fluffy reads pnpm lock files of versions 6 and 9",
            fix="Update the lock with pnpm 8 or later: `pnpm install --lockfile-only`.",
        )
    packages = data.get("packages") or {}
    snapshots = (data.get("snapshots") or {}) if version.startswith("9") else packages
    importers = data.get("importers") or {".": data}
    for part, value in (("packages", packages), ("snapshots", snapshots), ("importers", importers)):
        if not isinstance(value, dict):
            raise EnvironmentFailed(
                f"{file}: `{part}` is not a mapping",
                why="a pnpm lock's packages, snapshots and importers map names to entries",
                fix="Regenerate it: `pnpm install --lockfile-only`.",
            )
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
            tarball = resolution.get("tarball") if isinstance(resolution, dict) else None
            real = str(meta.get("name") or name)
            if (
                not isinstance(resolution, dict)
                or "integrity" not in resolution
                or (tarball is not None and not registry_download(str(tarball), real, ver))
            ):
                lock.refused.append(f"{real[:80]} ({snapshot[:120]}): not from the registry "
                                    "(git, tarball URL and folder dependencies are not "
                                    "fetched)")  # fmt: skip
            elif not _fits(meta, arch):
                lock.skipped.append(f"{snapshot[:120]}: for another platform")
            else:  # one per snapshot: peers make variants of one release
                keys[snapshot] = add_package(lock, real, ver, resolution.get("integrity"),
                                      snapshot[:120], key=snapshot.lstrip("/"))  # fmt: skip
        return keys[snapshot]

    for where, importer in sorted(importers.items(), key=lambda kv: str(kv[0]) != "."):
        for dep, value in dependency_groups(importer, ("dependencies", "devDependencies",
                                             "optionalDependencies")):  # fmt: skip
            text = str(value.get("version") if isinstance(value, dict) else value)
            if text.startswith("link:"):
                target = _join(str(where), text[len("link:") :])
                if target is not None and is_package_name(dep):
                    lock.links.setdefault(dep, target)
                continue
            key = package(_pnpm_target(dep, value))
            if key is not None and lock.roots.setdefault(dep, key) != key:
                lock.skipped.append(f"{where}: {dep} {key} (the top level has "
                                    f"{lock.roots[dep]}; workspace packages share it)")  # fmt: skip
    done: set[str] = set()
    while todo := [s for s, k in keys.items() if k is not None and s not in done]:
        for snapshot in todo:
            done.add(snapshot)
            owner = lock.packages[str(keys[snapshot])]
            for dep, value in dependency_groups(entry(snapshots, snapshot),
                                      ("dependencies", "optionalDependencies")):  # fmt: skip
                if not str(value).startswith("link:"):
                    target = package(_pnpm_target(dep, value))
                    if target is not None:
                        owner.deps.setdefault(dep, target)
    return lock


def dependency_groups(table: Any, groups: tuple[str, ...]) -> list[tuple[str, Any]]:
    """(name, value) of each dependency in ``table``'s ``groups``."""
    found: list[tuple[str, Any]] = []
    for group in groups:
        deps = table.get(group) if isinstance(table, dict) else None
        if isinstance(deps, dict):  # a name is a folder in node_modules: npm's names only
            found += [
                (str(name), value) for name, value in deps.items() if is_package_name(str(name))
            ]
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
