"""The plugin store: installed plugins' files under fluffy's home, with their hashes.

Layout (``$FLUFFY_HOME/plugins``, or ``FLUFFY_PLUGIN_STORE``)::

    <root>/<name>/<version>/...      the plugin's files, copied (0644 / 0755)
    <root>/<name>/install.json       version, source, SHA-256 of every file
    <root>/registry.db               the install registry (:mod:`.registry`)

The record lives beside the copy, not in it, so the plugin's own tree is exactly what was
installed.  What is copied: regular files only.  *Every* symbolic link is refused, not
only links that leave the folder: a link is a name whose meaning can change after
install without any recorded hash changing, and plain files are all a plugin needs.
Devices, FIFOs and sockets are refused; so are files over :data:`MAX_FILE_BYTES`, trees
over :data:`MAX_TOTAL_BYTES` or :data:`MAX_FILES`.  ``__pycache__`` folders and ``.pyc``
files are build output and are skipped.  The copy reads each file once (``O_NOFOLLOW``,
size re-checked on the open file) and hashes exactly the bytes it writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec

from fluffy.errors import (
    PluginInstallRefused,
    PluginNotFound,
    PluginRejected,
    PluginTampered,
)

MAX_FILE_BYTES: Final = 1024 * 1024
MAX_TOTAL_BYTES: Final = 10 * 1024 * 1024
MAX_FILES: Final = 256
MAX_DEPTH: Final = 16
SKIPPED_DIRS: Final = frozenset({"__pycache__"})
SKIPPED_SUFFIXES: Final = (".pyc",)
RECORD: Final = "install.json"
REGISTRY: Final = "registry.db"
STORE_ENV: Final = "FLUFFY_PLUGIN_STORE"


def default_root() -> Path:
    """``FLUFFY_PLUGIN_STORE`` (the kernel in L1: its mount), else ``$FLUFFY_HOME/plugins``."""
    from fluffy.paths import fluffy_home

    given = os.environ.get(STORE_ENV)
    return Path(given).expanduser() if given else fluffy_home() / "plugins"


def _refuse(what: str, why: str | None = None) -> PluginInstallRefused:
    return PluginInstallRefused(what, why=why)


class FileEntry(msgspec.Struct, frozen=True):
    rel: str
    size: int


def _walk(folder: Path, rel: str = "", depth: int = 0) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every entry under ``folder``, links never followed."""
    if depth > MAX_DEPTH:
        raise _refuse(f"{rel or folder} is nested more than {MAX_DEPTH} folders deep")
    try:
        names = sorted(child.name for child in folder.iterdir())
    except OSError as exc:
        raise _refuse(f"cannot list {folder}: {exc.strerror or exc}") from None
    for name in names:
        path = folder / name
        child = f"{rel}/{name}" if rel else name
        info = path.lstat()
        yield child, info
        if stat.S_ISDIR(info.st_mode) and name not in SKIPPED_DIRS:
            yield from _walk(path, child, depth + 1)


def _skipped(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in SKIPPED_DIRS for p in parts) or rel.endswith(SKIPPED_SUFFIXES)


def inspect_tree(folder: Path) -> list[FileEntry]:
    """The files a plugin folder would install, or :class:`PluginInstallRefused`."""
    if folder.is_symlink() or not folder.is_dir():
        raise _refuse(
            f"{folder} is not a plugin folder",
            why="a plugin is installed from a real directory (not a link) holding manifest.yaml",
        )
    files: list[FileEntry] = []
    total = 0
    for rel, info in _walk(folder):
        if _skipped(rel):
            continue
        mode = info.st_mode
        if stat.S_ISLNK(mode):
            target = str((folder / rel).readlink())
            leaves = not (folder / rel).resolve().is_relative_to(folder.resolve())
            raise _refuse(
                f"{rel} is a symbolic link to {target!r}"
                + (", which leaves the plugin folder" if leaves else ""),
                why="the store copies plain files only: a link could point elsewhere after "
                "install without any recorded hash changing",
            )
        if stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode):
            kind = "FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "device"
            raise _refuse(f"{rel} is a {kind}, not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise _refuse(
                f"{rel} is {info.st_size} bytes; a plugin file may be at most "
                f"{MAX_FILE_BYTES // 1024} KiB"
            )
        total += info.st_size
        files.append(FileEntry(rel, info.st_size))
        if len(files) > MAX_FILES:
            raise _refuse(f"the plugin folder holds more than {MAX_FILES} files")
    if total > MAX_TOTAL_BYTES:
        raise _refuse(
            f"the plugin's files add up to {total} bytes; at most "
            f"{MAX_TOTAL_BYTES // (1024 * 1024)} MiB may be installed"
        )
    return files


def read_capped(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """A regular file's bytes (no link followed, at most ``limit``), re-checked on the fd."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(f"{path} is no longer a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise _refuse(f"{path} grew beyond {limit // 1024} KiB while it was read")
    return data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_tree(folder: Path) -> dict[str, bytes]:
    """The files a plugin folder would install (relative path -> bytes), each read once."""
    files: dict[str, bytes] = {}
    total = 0
    for entry in inspect_tree(folder):
        data = read_capped(folder / entry.rel)
        total += len(data)
        if total > MAX_TOTAL_BYTES:
            raise _refuse("the plugin's files grew beyond the total limit while copied")
        files[entry.rel] = data
    return files


def check_rel(rel: str) -> str:
    """``rel`` if it names a file inside a plugin folder; :class:`PluginInstallRefused` if not."""
    parts = rel.split("/")
    if (
        not rel
        or "\x00" in rel
        or rel.startswith("/")
        or any(part in ("", ".", "..") for part in parts)
        or len(parts) > MAX_DEPTH + 2  # as deep as inspect_tree walks
        or _skipped(rel)
    ):
        raise _refuse(
            f"{rel!r} is not a plugin file's path",
            why="a plugin's files are named by relative paths inside its folder "
            "(no '..', no absolute path, no build output)",
        )
    return rel


def write_tree(folder: Path, files: Mapping[str, bytes]) -> dict[str, str]:
    """Write ``files`` under ``folder`` (0644, folders 0755); each one's SHA-256 by path."""
    hashes: dict[str, str] = {}
    total = 0
    for rel, data in sorted(files.items()):
        check_rel(rel)
        total += len(data)
        if len(data) > MAX_FILE_BYTES or total > MAX_TOTAL_BYTES or len(hashes) >= MAX_FILES:
            raise _refuse(f"{rel}: the plugin's files are over the store's limits")
        target = folder / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            target.write_bytes(data)
            target.chmod(0o644)
        except OSError as exc:  # e.g. "a" sent as a file and as a folder ("a/b")
            raise _refuse(f"{rel} cannot be written: {exc.strerror or exc}") from None
        hashes[rel] = sha256(data)
    return hashes


class Installed(msgspec.Struct, frozen=True):
    name: str
    version: str
    path: Path
    files: dict[str, str]
    source: str
    installed_at: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "path": str(self.path),
            "files": dict(self.files),
            "source": self.source,
            "installed_at": self.installed_at,
        }


class Verification(msgspec.Struct):
    """What differs from the install record (empty lists: intact)."""

    changed: list[str] = msgspec.field(default_factory=list)
    missing: list[str] = msgspec.field(default_factory=list)
    added: list[str] = msgspec.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.added)

    def describe(self) -> str:
        parts = [
            f"{label}: {', '.join(names[:10])}" + (" ..." if len(names) > 10 else "")
            for label, names in (
                ("changed", self.changed),
                ("missing", self.missing),
                ("added", self.added),
            )
            if names
        ]
        return "; ".join(parts) or "intact"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "changed": self.changed,
            "missing": self.missing,
            "added": self.added,
        }


class PluginStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def default(cls) -> PluginStore:
        return cls(default_root())

    @property
    def registry_file(self) -> Path:
        """The install registry, in the store (one read-only mount shows the kernel both)."""
        return self.root / REGISTRY

    def folder(self, name: str) -> Path:
        return self.root / name

    def _record_path(self, name: str) -> Path:
        return self.root / name / RECORD

    def get(self, name: str) -> Installed | None:
        path = self._record_path(name)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return Installed(
                name=str(data["name"]),
                version=str(data["version"]),
                path=self.root / name / str(data["version"]),
                files={str(k): str(v) for k, v in dict(data["files"]).items()},
                source=str(data.get("source", "")),
                installed_at=int(data.get("installed_at", 0)),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PluginTampered(
                f"the install record of {name} ({path}) cannot be read: {exc}"
            ) from None

    def require(self, name: str) -> Installed:
        found = self.get(name)
        if found is None:
            raise PluginNotFound(
                f"no plugin named {name!r} is installed in {self.root}",
                why="the store has no installed version of it",
            )
        return found

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / RECORD).is_file())

    # -- installing ----------------------------------------------------------------------
    def install(self, source: Path, name: str, version: str) -> Installed:
        """Copy the plugin folder ``source`` in as ``name`` ``version`` (refusals: nothing kept)."""
        self._check_free(name)
        return self.install_files(read_tree(source), name, version, str(source.resolve()))

    def install_files(
        self, files: Mapping[str, bytes], name: str, version: str, source: str
    ) -> Installed:
        """Write the plugin files ``files`` (relative path -> bytes) in as ``name`` ``version``.

        Exactly these bytes are written and hashed: what was read (and reviewed) once is
        what is installed.  A refusal keeps nothing.
        """
        self._check_free(name)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
        staging = self.root / f".install-{uuid.uuid4().hex}"
        staging.mkdir(mode=0o755)
        try:
            hashes = write_tree(staging, files)
            final = self.root / name / version
            final.parent.mkdir(mode=0o755, exist_ok=True)
            staging.replace(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(OSError):
                (self.root / name).rmdir()  # only if empty: nothing half-installed stays
            raise
        installed = Installed(name, version, final, hashes, source, int(time.time() * 1000))
        record = self._record_path(name)
        tmp = record.with_name(f".{RECORD}.tmp")
        tmp.write_text(json.dumps(installed.to_dict(), indent=1, sort_keys=True), "utf-8")
        tmp.chmod(0o644)
        tmp.replace(record)
        return installed

    def _check_free(self, name: str) -> None:
        if self.get(name) is not None:
            raise PluginRejected(
                f"a plugin named {name!r} is already installed",
                why="plugin names are unique",
                fix=f"Remove it first (`fluffy plugin remove {name}`), then install again.",
            )

    def remove(self, name: str) -> None:
        folder = self.folder(name)
        if not (folder / RECORD).is_file():
            raise PluginNotFound(
                f"no plugin named {name!r} is installed in {self.root}",
                why="the store has no install record for it",
            )
        (folder / RECORD).unlink()  # first: a half-removed plugin is no longer installed
        shutil.rmtree(folder, ignore_errors=True)

    # -- checking ------------------------------------------------------------------------
    def verify(self, name: str) -> Verification:
        """Recompute every hash of ``name``'s installed files against its record."""
        installed = self.require(name)
        report = Verification()
        present: dict[str, os.stat_result] = {}
        if installed.path.is_dir() and not installed.path.is_symlink():
            for rel, info in _walk(installed.path):
                if not stat.S_ISDIR(info.st_mode) and not _skipped(rel):
                    present[rel] = info
        for rel, digest in sorted(installed.files.items()):
            found = present.get(rel)
            if found is None:
                report.missing.append(rel)
            elif not stat.S_ISREG(found.st_mode) or found.st_size > MAX_FILE_BYTES:
                report.changed.append(rel)
            else:
                try:
                    intact = sha256(read_capped(installed.path / rel)) == digest
                except (OSError, PluginInstallRefused):
                    intact = False
                if not intact:
                    report.changed.append(rel)
        report.added = sorted(set(present) - set(installed.files))
        return report

    def read_verified(self, name: str) -> tuple[Installed, dict[str, bytes]]:
        """Every recorded file's bytes, each checked against its hash (for a sandbox copy).

        Only recorded files are returned: a file added to the store is never shipped.
        """
        installed = self.require(name)
        contents: dict[str, bytes] = {}
        for rel, digest in sorted(installed.files.items()):
            try:
                data = read_capped(installed.path / rel)
            except (OSError, PluginInstallRefused) as exc:
                raise PluginTampered(f"{name}: {rel} cannot be read as installed: {exc}") from None
            if sha256(data) != digest:
                raise PluginTampered(f"{name}: {rel} no longer matches its recorded hash")
            contents[rel] = data
        return installed, contents
