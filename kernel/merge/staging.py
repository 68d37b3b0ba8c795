"""A session's staging area: validated changes waiting for the merge.

Layout (fixed: sandboxes see it read-only at ``/staged``)::

    <root>/tree/<rel path>   full new content of every staged new or changed file
    <root>/deleted.txt       rel paths staged for deletion, one per line
    <root>/meta.json         kernel bookkeeping: per path, the project's sha256 when the
                             path was first staged (None: absent) and the staged sha256

The *view* a later sandbox works against is the project plus this area.  ``meta.json``
names every change: a new content is written to ``tree/`` before ``meta.json`` names it,
a deletion is recorded in ``meta.json`` (synced) before the tree file goes, so on open
:meth:`Staging._reconcile` can repair what an interrupted ``stage`` left.  A write is
atomic, not durable (ADR-094): nothing of it is synced, and ``meta.json`` records the
machine's boot id.  Reopened in the same boot (the kernel was killed: the page cache
holds every completed write) a tree file newer than ``meta.json`` is adopted; after a
machine crash it may be empty or partial, so a file that does not match ``meta.json`` is
dropped with its entry (:attr:`Staging.lost`): a staged change may be lost, never one
half written.
Folders are 0755 and files 0644 (the sandbox reads them as another uid).  Not
thread-safe: the caller serialises operations on one staging area.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Literal

import msgspec

from fluffy.errors import MergeError, MergeRefused
from fluffy.kernel.confined_files import (
    file_sha256,
    read_existing,
    remove_file,
    safe_relpath,
    write_atomic,
)
from fluffy.kernel.merge.patch import count_diff_lines, unified_diff
from fluffy.merge3 import is_binary

#: Largest file the view reads (project or staged), in bytes.
MAX_VIEW_BYTES = 64 * 1024 * 1024
DIR_MODE = 0o755
FILE_MODE = 0o644
_META_VERSION = 1
log = logging.getLogger("fluffy.kernel.staging")


def _boot_id() -> str:
    """This boot of the machine (the same inside its containers); "" if unknown."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return ""


#: a write's files are synced only where the boot id is unknown (a crash is undetectable)
BOOT_ID = _boot_id()


class StagedChange(msgspec.Struct, frozen=True):
    path: str
    op: Literal["write", "delete"]
    sha256: str | None  # of the staged content; None for a delete
    base_sha256: str | None  # of the project file when first staged; None: it was absent


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def _os_errors(what: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise MergeError(
            f"{what}: {exc.strerror or exc}",
            why="the kernel's state folder could not be read or written",
            fix="Check the state folder's disk space and permissions, then retry.",
        ) from exc


class Staging:
    """The staging area at ``root`` for ``project`` (see the module docstring)."""

    def __init__(self, root: Path, project: Path) -> None:
        self.root = root
        self.project = project
        self.tree = root / "tree"
        #: the project's content of each path when the session first staged it: what the
        #: model's change was made against (a three-way merge's base, fluffy/merge3.py)
        self.bases = root / "base"
        self._entries: dict[str, tuple[str | None, str | None]] = {}  # path -> (base, new)
        self._listing: bytes | None = None  # deleted.txt as this object last wrote it
        self._boot: str | None = None  # the boot meta.json was saved in (None: unknown)
        #: staged paths a machine crash left incomplete, dropped when the area opened
        self.lost: list[str] = []
        with _os_errors(f"cannot open staging area {root}"):
            root.mkdir(parents=True, exist_ok=True)
            root.chmod(DIR_MODE)
            self.tree.mkdir(exist_ok=True)
            self.tree.chmod(DIR_MODE)
            self._load()
            self._reconcile()
        if self.lost:  # (ADR-094) whoever opens the area first: the session or a merge
            log.warning("%s: a machine crash left %s incomplete; dropped", root, self.lost)

    # -- persistence -----------------------------------------------------------------

    def _load(self) -> None:
        try:
            raw = json.loads((self.root / "meta.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except ValueError:  # only a machine crash tears it (it is written atomically)
            self._boot = ""  # an unknown boot: nothing in the area is trusted
            return
        for path, (base, new) in raw.get("entries", {}).items():
            self._entries[safe_relpath(path)] = (base, new)
        boot = raw.get("boot")
        self._boot = boot if isinstance(boot, str) else None

    def _save(self, *, sync_folder: bool = False, sync: bool = True) -> None:
        # the area's writes sync their data, not their folders: a machine crash leaves an
        # older meta.json or file, which _reconcile repairs on the next open (a staged
        # change may be lost, never one half written); clearing the area, and what the
        # person keeps -- the project, its merge log -- is synced in full.  sync=False:
        # a write's, which names the boot it was made in (see the module docstring)
        meta: dict[str, object] = {"version": _META_VERSION, "entries": self._entries}
        if BOOT_ID:  # (the area's files may be unsynced as of this boot)
            meta["boot"] = BOOT_ID
        data = json.dumps(meta, sort_keys=True, indent=1).encode()
        write_atomic(
            self.root,
            "meta.json",
            data,
            mode=0o600,
            sync_folder=sync_folder,
            sync=sync or not BOOT_ID,
        )
        deleted = sorted(path for path, (_, new) in self._entries.items() if new is None)
        listing = "".join(f"{path}\n" for path in deleted).encode()
        if listing != self._listing:  # (most saves stage a file: the list is unchanged)
            write_atomic(self.root, "deleted.txt", listing, mode=FILE_MODE, sync_folder=False)
            self._listing = listing

    def _reconcile(self) -> None:
        """Repair what an interrupted :meth:`stage` left (meta.json is authoritative;
        a newer tree file is trusted only in the boot meta.json was saved in, and what
        another boot left that meta.json does not vouch for is dropped into ``lost``)."""
        trusted = self._boot is None or self._boot == BOOT_ID
        changed = False
        for child in self.root.iterdir():  # a save interrupted between write and rename
            if child.name.startswith(".") and child.name.endswith(".tmp") and child.is_file():
                child.unlink()
        on_disk = set(self._tree_files())
        for path in sorted(on_disk - self._entries.keys()):  # meta.json never named it
            if not trusted:  # (in this boot: its call never answered)
                self.lost.append(path)
            self._remove(path)
        for path, (base, new) in list(self._entries.items()):
            if new is None:
                if path in on_disk:  # recorded, then killed before the file went
                    remove_file(self.tree, path)
                continue
            actual = file_sha256(self.tree, path, MAX_VIEW_BYTES)
            if actual == new:
                continue
            if actual is not None and trusted:  # rewritten, then killed before meta.json
                self._entries[path] = (base, actual)
            else:  # gone, or not known to be complete: the change is lost, not half kept
                del self._entries[path]
                self.lost.append(path)
                self._remove(path)
            changed = True
        # synced, naming this boot, before any unsynced write: a torn file is never
        # trusted on the strength of an older meta.json
        if (
            changed
            or self.lost
            or self._boot != (BOOT_ID or None)
            or not (self.root / "deleted.txt").exists()
        ):
            self._save()

    def _tree_files(self) -> Iterator[str]:
        for folder, dirs, files in os.walk(self.tree):
            rel = Path(folder).relative_to(self.tree)
            dirs.sort()
            for name in sorted(files):
                yield (rel / name).as_posix()

    # -- the view --------------------------------------------------------------------

    def read(self, rel: str) -> bytes | None:
        """The view's content of ``rel``: staged if staged, else the project's."""
        rel = safe_relpath(rel)
        with _os_errors(f"cannot read {rel!r}"):
            entry = self._entries.get(rel)
            if entry is not None:
                if entry[1] is None:
                    return None
                data = read_existing(self.tree, rel, MAX_VIEW_BYTES)
                if data is None:
                    raise MergeError(
                        f"staged file {rel!r} is missing from {self.tree}",
                        why="the session's staged tree lost a file its record lists",
                        fix="Reject the change (`/reject`) and write it again.",
                    )
                return data
            return read_existing(self.project, rel, MAX_VIEW_BYTES)

    def project_sha256(self, rel: str) -> str | None:
        with _os_errors(f"cannot read {rel!r} in the project"):
            return file_sha256(self.project, rel, MAX_VIEW_BYTES)

    def staged_files(self) -> set[str]:
        """Paths with staged content (not deletions)."""
        return {path for path, (_, new) in self._entries.items() if new is not None}

    # -- changes ---------------------------------------------------------------------

    def stage(self, rel: str, content: bytes | None) -> StagedChange | None:
        """Stage ``content`` for ``rel`` (None: delete); None when it equals the project.

        The project's sha256 is taken when ``rel`` is first staged and kept until the
        merge: it is what the merge compares against to detect conflicts.
        """
        rel = safe_relpath(rel)
        with _os_errors(f"cannot stage {rel!r}"):
            entry = self._entries.get(rel)
            if entry is not None:
                base = entry[0]
            else:  # the content and its hash from one read: the merge's base
                current = read_existing(self.project, rel, MAX_VIEW_BYTES)
                base = None if current is None else sha256(current)
            new = None if content is None else sha256(content)
            if new == base:  # back to the project's content: nothing left to merge
                if entry is not None:
                    self.drop(rel)
                return None
            if entry is None and current is not None:
                self.bases.mkdir(mode=DIR_MODE, exist_ok=True)
                write_atomic(  # unsynced: base() checks the copy against its hash
                    self.bases,
                    rel,
                    current,
                    mode=FILE_MODE,
                    dir_mode=DIR_MODE,
                    sync_folder=False,
                    sync=not BOOT_ID,
                )
            if content is None:
                self._entries[rel] = (base, None)
                self._save()
                remove_file(self.tree, rel)
                self._prune(rel)
            else:
                write_atomic(
                    self.tree,
                    rel,
                    content,
                    mode=FILE_MODE,
                    dir_mode=DIR_MODE,
                    sync_folder=False,
                    sync=not BOOT_ID,
                )
                self._entries[rel] = (base, new)
                self._save(sync=False)
            return StagedChange(rel, "delete" if new is None else "write", new, base)

    def _prune(self, rel: str, tree: Path | None = None) -> None:
        """Remove folders of tree/ (or ``tree``) that ``rel``'s removal left empty."""
        tree = self.tree if tree is None else tree
        parent = Path(rel).parent
        while parent != Path():
            try:
                (tree / parent).rmdir()
            except OSError:
                return
            parent = parent.parent

    def drop(self, rel: str) -> None:
        """Unstage ``rel`` altogether (its content and its base)."""
        rel = safe_relpath(rel)
        with _os_errors(f"cannot unstage {rel!r}"):
            if self._entries.pop(rel, None) is not None:
                self._save()
            self._remove(rel)

    def _remove(self, rel: str) -> None:
        """Remove ``rel``'s staged content and its base copy."""
        for tree in (self.tree, self.bases):
            if tree.is_dir():
                remove_file(tree, rel)
                self._prune(rel, tree)

    def base(self, rel: str) -> bytes | None:
        """The project's content of ``rel`` when it was first staged (None: it did not
        exist, or that copy is gone or does not match the recorded hash)."""
        entry = self._entries.get(safe_relpath(rel))
        if entry is None or entry[0] is None or not self.bases.is_dir():
            return None
        with _os_errors(f"cannot read the base of {rel!r}"):
            data = read_existing(self.bases, rel, MAX_VIEW_BYTES)
        return data if data is not None and sha256(data) == entry[0] else None

    def changes(self) -> list[StagedChange]:
        return [
            StagedChange(path, "delete" if new is None else "write", new, base)
            for path, (base, new) in sorted(self._entries.items())
        ]

    def overlay(self) -> dict[str, str | None]:
        """rel path -> sha256 of its staged content (None: staged for deletion)."""
        return {path: new for path, (_, new) in sorted(self._entries.items())}

    def is_empty(self) -> bool:
        return not self._entries

    def diff(self, paths: Collection[str] | None = None) -> str:
        """A unified diff of every staged change against the project (for review), or
        of those of ``paths`` only (what one call staged)."""
        parts: list[str] = []
        for change in self.changes():
            if paths is not None and change.path not in paths:
                continue
            try:
                with _os_errors(f"cannot diff {change.path!r}"):
                    old = read_existing(self.project, change.path, MAX_VIEW_BYTES)
            except MergeRefused as exc:  # e.g. the project's file became a symlink
                parts.append(f"Unreadable a/{change.path}: {exc.why}\n")
                old = None
            new = self.read(change.path)
            parts.append(render_diff(change.path, old, new))
        return "".join(parts)

    def diff_lines(self) -> int:
        return count_diff_lines(self.diff())

    def clear(self) -> None:
        """Discard everything staged (after a merge, or when the user rejects).  Synced
        in full: the merge log records the area cleared next, and a crash must not bring
        merged changes back as staged ones."""
        with _os_errors(f"cannot clear staging area {self.root}"):
            self._entries.clear()
            self._save(sync_folder=True)
            for child in self.tree.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            shutil.rmtree(self.bases, ignore_errors=True)


def decode_text(data: bytes | None) -> str | None:
    """``data`` as UTF-8 text; raises UnicodeDecodeError for binary content."""
    return None if data is None else data.decode("utf-8")


def render_diff(path: str, old: bytes | None, new: bytes | None) -> str:
    """A unified diff of one file, or git's one-line notice for binary content."""
    if is_binary(old) or is_binary(new):
        fromfile = "/dev/null" if old is None else f"a/{path}"
        tofile = "/dev/null" if new is None else f"b/{path}"
        return f"Binary files {fromfile} and {tofile} differ\n"
    return unified_diff(path, decode_text(old), decode_text(new))
