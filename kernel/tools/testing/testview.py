"""The view a test sandbox runs in: one folder per session, kept in step incrementally.

``test.run`` needs the project *as the session sees it* (the project plus its staged
changes) in one real folder: pytest, coverage and the project's own install all work on
paths, so an overlay of two mounts will not do.  Copying the whole tree for every call
made a test run on a larger repository slow before pytest even started.  So the kernel
keeps one folder per session, ``<state>/views/<session>/tree``, and before each run
brings it in step: a walk of the project (``lstat`` only) compares each file's
signature (size, mtime, inode, mode) with the last sync and copies only what changed,
then lays the staged changes and the files the project's environment generated (e.g. a
``_version.py``) on top, and removes what is gone.  Unchanged files are hard links when
the folder and the project share a file system and the sandbox may read the file, else
copies; the kernel never writes into an existing file of the view (a temporary file is
renamed over it), so a link never carries a write back to the project.

The sync returns the tree hashes of what it laid down, split into tests and sources: the
evidence of the run is exactly the view pytest saw.  The folder is mounted read-only at
``/workspace`` in the test sandbox, so nothing a test does survives into a later run.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import msgspec
from msgspec.structs import astuple

from fluffy.kernel.confined_files import plain_file
from fluffy.kernel.globs import Patterns
from fluffy.kernel.project.testsecrets import SecretFiles
from fluffy.kernel.project.viewfiles import Entry, ignored, walk_project
from fluffy.kernel.workflow.evidence import DEFAULT_TEST_GLOBS, TreeSnapshot
from fluffy.pathnames import shown

_CHUNK = 1024 * 1024
_LINK_SCHEME = b"symlink:"


class _Item(msgspec.Struct):
    source: str  # "project" | "staged" | "generated" | "git" | "hidden" (a secret: hashed only)
    signature: tuple[int, ...]  # project: Entry.signature; staged: (); generated: stat
    sha256: str


class Synced(msgspec.Struct, frozen=True):
    folder: Path
    tests: TreeSnapshot
    sources: TreeSnapshot
    copied: int
    linked: int
    removed: int
    #: the person's secret files the view leaves out (:mod:`...project.testsecrets`)
    hidden: tuple[str, ...] = ()


def _hash_copy(src: Path, dest: Path, mode: int) -> str:
    """Copy ``src`` to a new file renamed onto ``dest``; the content's sha256."""
    digest = hashlib.sha256()
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        with os.fdopen(fd, "rb", closefd=False) as reader, tmp.open("wb") as writer:
            for chunk in iter(lambda: reader.read(_CHUNK), b""):
                digest.update(chunk)
                writer.write(chunk)
        tmp.chmod(mode)
        tmp.replace(dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return digest.hexdigest()


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as reader:
        for chunk in iter(lambda: reader.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _nothing(rel: str) -> bool:
    return False


def _hash_entry(project: Path, entry: Entry) -> str:
    """A project file's hash as the TDD evidence takes it (a link: its target)."""
    if entry.link is not None:
        return hashlib.sha256(_LINK_SCHEME + os.fsencode(entry.link)).hexdigest()
    return _hash_file(project / entry.rel)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _link_inside(rel: str, target: str) -> bool:
    if target.startswith("/"):
        return False
    depth = len(rel.split("/")) - 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


class SessionView:
    """One session's test view (see the module docstring).  Not thread-safe: the owner
    (:class:`TestViews`) serialises syncs of one session."""

    def __init__(self, root: Path, project: Path, sandbox_uid: int) -> None:
        self.root = root
        self.tree = root / "tree"
        self.project = project
        self.sandbox_uid = sandbox_uid
        self.items: dict[str, _Item] = {}
        self.can_link = True
        _remove(root)
        self.tree.mkdir(parents=True, mode=0o755)
        for folder in (root, self.tree):
            folder.chmod(0o755)

    def _dest(self, rel: str) -> Path:
        dest = self.tree / rel
        parent = dest.parent
        if parent != self.tree:
            # a file where a folder must go (the tree changed shape): replace it
            probe = self.tree
            for part in Path(rel).parent.parts:
                probe = probe / part
                if probe.is_symlink() or (probe.exists() and not probe.is_dir()):
                    _remove(probe)
                    self.items.pop(probe.relative_to(self.tree).as_posix(), None)
            parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
            prefix = rel + "/"
            self.items = {k: v for k, v in self.items.items() if not k.startswith(prefix)}
        return dest

    def _readable(self, entry: Entry) -> bool:
        info = (self.project / entry.rel).lstat()
        return bool(info.st_mode & stat.S_IROTH) or info.st_uid == self.sandbox_uid

    def _place(self, entry: Entry) -> tuple[str, bool]:
        """Put a project file into the view; (sha256, linked?)."""
        dest = self._dest(entry.rel)
        src = self.project / entry.rel
        if entry.link is not None:
            _remove(dest)
            if _link_inside(entry.rel, entry.link):
                dest.symlink_to(entry.link)
            return _hash_entry(self.project, entry), False
        if self.can_link and self._readable(entry):
            tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.lnk")
            try:
                os.link(src, tmp, follow_symlinks=False)
            except OSError as exc:
                if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    self.can_link = exc.errno not in (errno.EXDEV, errno.ENOTSUP)
                else:
                    raise
            else:
                tmp.replace(dest)
                return _hash_file(dest), True
        mode = (entry.mode & 0o755) | 0o644
        return _hash_copy(src, dest, mode), False

    def _git_entries(self) -> Iterator[Entry]:
        git = self.project / ".git"
        if not git.is_dir() or git.is_symlink():
            return
        for entry in walk_project(git):
            yield Entry(f".git/{entry.rel}", *astuple(entry)[1:])

    def sync(
        self,
        overlay: Mapping[str, str | None],
        staged_tree: Path | None,
        generated: Path | None,
        generated_files: Sequence[str],
        test_globs: Sequence[str],
        git: bool = False,
        hide: Callable[[str], bool] = lambda rel: False,
    ) -> Synced:
        copied = linked = removed = 0
        hidden: list[str] = []
        seen: set[str] = {rel for rel, item in self.items.items() if item.source == "git"}
        entries = walk_project(self.project)
        if git:  # a copy of git's metadata for sandboxes that cannot read the project's
            seen.clear()
            entries = itertools.chain(entries, self._git_entries())
        for entry in entries:
            if entry.rel in overlay:
                continue
            seen.add(entry.rel)
            git_file = entry.rel.startswith(".git/")
            secret = not git_file and hide(entry.rel)
            if secret:
                hidden.append(shown(entry.rel))
            source = "git" if git_file else "hidden" if secret else "project"
            known = self.items.get(entry.rel)
            if known is not None and known.source == source and known.signature == entry.signature:
                continue
            try:
                if secret:  # hashed as the evidence hashes the project, never laid in
                    _remove(self.tree / entry.rel)
                    sha = _hash_entry(self.project, entry)
                else:
                    sha, was_linked = self._place(entry)
                    linked += was_linked
                    copied += not was_linked
            except OSError:
                sha = hashlib.sha256(b"unreadable").hexdigest()
                copied += not secret
            self.items[entry.rel] = _Item(source, entry.signature, sha)
        for rel, staged_sha in overlay.items():
            if staged_sha is None or ignored(rel):
                continue
            seen.add(rel)
            known = self.items.get(rel)
            if known is not None and known.source == "staged" and known.sha256 == staged_sha:
                continue
            if staged_tree is None:
                continue
            placed = _hash_copy(staged_tree / rel, self._dest(rel), 0o644)
            self.items[rel] = _Item("staged", (), placed)
            copied += 1
        for rel in generated_files:
            if rel in seen or generated is None or ignored(rel) or not plain_file(generated, rel):
                continue
            src = generated / rel
            info = src.stat()
            signature = (info.st_mtime_ns, info.st_size)
            seen.add(rel)
            known = self.items.get(rel)
            if known is not None and known.source == "generated" and known.signature == signature:
                continue
            self.items[rel] = _Item("generated", signature, _hash_copy(src, self._dest(rel), 0o644))
            copied += 1
        for rel in [r for r in self.items if r not in seen]:
            del self.items[rel]
            _remove(self.tree / rel)
            removed += 1
        spec = Patterns(test_globs)
        tests: dict[str, str] = {}
        sources: dict[str, str] = {}
        for rel, item in self.items.items():
            if item.source in ("project", "staged", "hidden"):
                (tests if spec.match(rel) else sources)[shown(rel)] = item.sha256
        return Synced(
            self.tree, TreeSnapshot(tests), TreeSnapshot(sources), copied, linked, removed,
            tuple(hidden),
        )  # fmt: skip


class TestViews:
    """Every session's test view, under ``<state>/views`` (emptied at kernel start)."""

    __test__ = False  # not a pytest test class

    def __init__(
        self, state_dir: Path, project: Path, sandbox_uid: int, *, persons: bool = False
    ) -> None:
        """``persons``: the views are for the person's own commands (``fluffy sandbox
        run``), which see their secret files as they do on the host."""
        self.root = state_dir / "views"
        self.project = project
        self.secrets = None if persons else SecretFiles(project, state_dir)
        self.sandbox_uid = sandbox_uid
        self.sessions: dict[str, SessionView] = {}
        self._locks: dict[str, threading.Lock] = {}
        _remove(self.root)
        self.root.mkdir(parents=True, mode=0o755)
        self.root.chmod(0o755)

    def hidden(self) -> Callable[[str], bool]:
        """Which project files the views leave out, as of now (the person's secrets)."""
        return self.secrets.hidden() if self.secrets is not None else _nothing

    def sync(
        self,
        session_id: str,
        overlay: Mapping[str, str | None],
        staged_tree: Path | None,
        *,
        generated: Path | None = None,
        generated_files: Sequence[str] = (),
        test_globs: Sequence[str] = DEFAULT_TEST_GLOBS,
        git: bool = False,
    ) -> Synced:
        """Bring the session's view in step (call off the event loop); ``git`` copies git's
        metadata too (for a sandbox that cannot read the project's).  The person's secret
        files are left out of every view (:mod:`fluffy.kernel.project.testsecrets`)."""
        lock = self._locks.setdefault(session_id, threading.Lock())
        with lock:
            view = self.sessions.get(session_id)
            if view is None:
                view = SessionView(self.root / session_id, self.project, self.sandbox_uid)
                self.sessions[session_id] = view
            hide = self.hidden()
            return view.sync(
                overlay, staged_tree, generated, generated_files, test_globs, git, hide
            )

    def discard(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        _remove(self.root / session_id)
