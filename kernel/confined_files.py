"""Confined file access: safe relative paths, no-follow walks, atomic writes.

Every path the kernel takes from a sandbox goes through :func:`safe_relpath` (relative,
normalised, never ``..``, never inside ``.git``) and :class:`ProtectedPaths`.  Every file
operation then walks the directory components from an open directory fd with
``O_NOFOLLOW | O_DIRECTORY``, so a symlink anywhere on the way is refused instead of
followed, and the target is inspected with ``lstat`` semantics before it is opened: a
symlink, directory, fifo, socket or device is refused (never opened, so a fifo cannot
block and a device cannot react to the open).  Writes go to a temporary file in the
target's directory, are fsynced, renamed over the target and the directory is fsynced.

Refusals raise :class:`~fluffy.errors.MergeRefused` naming the path and the reason;
other ``OSError`` s (disk full, permissions) propagate to the caller, which maps them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from fluffy.errors import MergeRefused
from fluffy.kernel.globs import GlobSet

#: Always protected (gitignore syntax); callers may add globs, never remove these.
DEFAULT_PROTECTED: tuple[str, ...] = (".fluffy/**", ".git/**", ".fluffy", ".git")

#: Paths whose change always needs the user's review (gitignore syntax).  Secrets and
#: keys; CI definitions; files that run code at install/build time or pin dependencies;
#: git's own configuration files kept in the tree.
DEFAULT_SENSITIVE: tuple[str, ...] = (
    # secrets and keys
    *(".env", ".env.*", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*"),
    *("id_ed25519*", "**/secrets/**", "**/.ssh/**", ".pypirc", ".npmrc", ".yarnrc*"),
    # CI definitions
    *(".github/**", ".gitlab-ci.yml", ".gitlab/**", ".circleci/**", ".travis.yml"),
    *("azure-pipelines.yml", "Jenkinsfile", "bitbucket-pipelines.yml", "appveyor.yml"),
    *(".readthedocs.y*ml",),
    # git's own files kept in the tree, and hooks the host runs
    *(".gitignore", ".gitattributes", ".gitmodules", ".githooks/**", ".husky/**"),
    *(".pre-commit-config.yaml", ".pre-commit-hooks.yaml"),
    # editor and container settings the host acts on
    *(".vscode/**", ".idea/**", ".devcontainer/**", "Dockerfile", "Containerfile"),
    *("docker-compose*.y*ml", "compose*.y*ml"),
    # what runs at install or build time, or pins dependencies
    *("pyproject.toml", "setup.py", "setup.cfg", "*requirements*.txt", "requirements/**"),
    *("constraints*.txt", "Pipfile", "Pipfile.lock", "poetry.lock", "uv.lock", "pdm.lock"),
    *("tox.ini", "noxfile.py", "docs/conf.py", "Makefile", "justfile", "Taskfile.y*ml"),
    *("package.json", "package-lock.json", "yarn.lock", "pnpm-lock.yaml", "Cargo.toml"),
    *("npm-shrinkwrap.json", "pnpm-workspace.yaml", ".pnpmfile.*", ".yarn/**", "bun.lock*"),
    *("bunfig.toml", ".nvmrc", ".node-version", "lerna.json", "nx.json", "turbo.json"),
    # JavaScript tools' settings are code the person's tools run (dev server, linter,
    # test runner, editor's TypeScript plugins)
    *("*.config.js", "*.config.cjs", "*.config.mjs", "*.config.ts", "*.config.mts"),
    *("*.config.cts", ".eslintrc*", ".babelrc*", ".prettierrc*", "tsconfig*.json"),
    *("Cargo.lock", "build.rs", ".cargo/**", "go.mod", "go.sum"),
    # tools' settings that name code to run (plugins, hooks, init-hook, wrappers)
    *(".claude/**", ".cursor/**", ".zed/**", ".mcp.json", ".pylintrc", "pylintrc"),
    *("mypy.ini", ".mypy.ini", "pytest.ini", ".coveragerc", "lefthook.y*ml", ".lefthook.y*ml"),
    *("mise.toml", ".mise.toml", ".tool-versions", "gradle/wrapper/**", ".mvn/**"),
    *(".lfsconfig",),
)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_PATH = 4096

Base = Path | int


def refused(path: str, reason: str, *, fix: str | None = None) -> MergeRefused:
    """A :class:`MergeRefused` for ``path`` with ``reason`` as its *why*."""
    return MergeRefused(f"refused to merge {path!r}: {reason}", why=reason, fix=fix)


def _components(raw: object, what: str) -> list[str]:
    """The normalised components of a relative posix path, or :class:`MergeRefused`."""
    if not isinstance(raw, str):
        raise refused(repr(raw), f"the {what} is not a string")
    shown = raw[:200]
    if raw == "":
        raise refused(shown, f"the {what} is empty")
    if len(raw) > _MAX_PATH:
        raise refused(shown, f"the {what} is longer than {_MAX_PATH} characters")
    if "\x00" in raw:
        raise refused(shown, f"the {what} contains a NUL byte")
    if "\\" in raw:
        raise refused(shown, f"the {what} contains a backslash", fix="Use '/' to separate.")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in raw):
        raise refused(shown, f"the {what} contains a control character (newline, tab, ...)")
    if raw.startswith("/"):
        raise refused(shown, f"the {what} is absolute", fix="Use a path relative to the root.")
    if raw.endswith("/"):
        raise refused(shown, f"the {what} names a directory, not a file")
    parts = [part for part in raw.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise refused(shown, f"the {what} contains a '..' component")
    if not parts:
        raise refused(shown, f"the {what} names the root itself")
    return parts


def safe_relpath(raw: str) -> str:
    """``raw`` as a normalised posix path relative to the project, or MergeRefused.

    Refused: empty, NUL, backslash, control characters, absolute, trailing ``/``, any
    ``..`` component, ``.``-only, and any component named ``.git`` (any case: only the
    git merge writes git's metadata, and case-insensitive file systems exist).
    """
    parts = _components(raw, "path")
    if any(part.lower() == ".git" for part in parts):
        raise refused(
            raw,
            "the path is inside git's metadata (.git)",
            fix="Commit through git.commit; files under .git are never written by a merge.",
        )
    return "/".join(parts)


def plain_file(root: Path, rel: str) -> bool:
    """``rel`` is a normalised relative path (:func:`safe_relpath`) naming a regular file
    under ``root``, reached through no symbolic link."""
    try:
        if safe_relpath(rel) != rel:
            return False
    except MergeRefused:
        return False
    path = root.resolve() / rel
    return path.resolve() == path and path.is_file() and not path.is_symlink()


def relative_parts(raw: str) -> list[str]:
    """Components of a relative path inside a trusted folder (sandbox output files)."""
    return _components(raw, "output file name")


class ProtectedPaths:
    """Globs (gitignore syntax) no merge may write; the defaults always apply."""

    __slots__ = ("_globs", "globs")

    def __init__(self, extra: Sequence[str] = ()) -> None:
        self.globs: tuple[str, ...] = tuple(dict.fromkeys((*DEFAULT_PROTECTED, *extra)))
        self._globs = GlobSet(self.globs)

    def matches(self, rel: str) -> bool:
        # case-insensitively too: on macOS or Windows `.FLUFFY/policy.yaml` *is* the policy
        return self._globs.match(rel) or self._globs.match(rel.lower())

    def check(self, rel: str) -> None:
        if self.matches(rel):
            raise refused(
                rel,
                "the path is protected (fluffy's own state, git metadata or a policy glob)",
                fix="Protected files change only through their own commands (policy.update).",
            )


def _open_base(base: Base) -> int:
    if isinstance(base, int):
        return os.dup(base)
    return os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "an unknown kind of file"


def _match_owner(fd: int, like: os.stat_result) -> None:
    """Give a file or folder the kernel just made the owner of ``like`` (the file it
    replaces, or the folder it is made in): a merge never changes who owns the user's
    project.  Possible when the kernel runs as that owner (nothing to do) or holds
    CAP_CHOWN (a root-owned project); otherwise the kernel's own uid stays.  Modes are
    set before: without CAP_FOWNER the kernel cannot chmod a file it gave away."""
    made = os.fstat(fd)
    if (made.st_uid, made.st_gid) != (like.st_uid, like.st_gid):
        with contextlib.suppress(PermissionError):
            os.fchown(fd, like.st_uid, like.st_gid)


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _descend(fd: int, part: str, shown: str, *, create: bool, dir_mode: int | None) -> int | None:
    """Open directory ``part`` under ``fd`` without following links (None: it is absent)."""
    for _ in range(3):
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.mkdir(part, 0o755 if dir_mode is not None else 0o777, dir_fd=fd)
            except FileExistsError:
                continue
            made = os.open(part, _DIR_FLAGS, dir_fd=fd)
            if dir_mode is not None:
                os.fchmod(made, dir_mode)
            _match_owner(made, os.fstat(fd))
            os.fsync(fd)
            return made
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            info = _lstat(fd, part)
            if info is None:
                continue
            raise refused(
                shown, f"the component {part!r} is {_kind(info.st_mode)}, not a directory"
            ) from None
    raise refused(shown, f"the component {part!r} keeps changing while it is opened")


@contextlib.contextmanager
def parent_dir(
    base: Base, rel: str, *, create: bool = False, dir_mode: int | None = None
) -> Iterator[tuple[int, str] | None]:
    """``(fd of the directory holding rel, its last name)``; None when a folder is absent.

    ``base`` (a path or an open directory fd) is trusted and may itself be reached
    through links; every component of ``rel`` below it is opened without following.

    ``create`` makes missing folders (``dir_mode`` explicit, else 0o777 minus the umask).
    """
    parts = rel.split("/")
    fd = _open_base(base)
    try:
        for part in parts[:-1]:
            nxt = _descend(fd, part, rel, create=create, dir_mode=dir_mode)
            os.close(fd)
            fd = -1
            if nxt is None:
                yield None
                return
            fd = nxt
        yield fd, parts[-1]
    finally:
        if fd >= 0:
            os.close(fd)


def _regular(dir_fd: int, name: str, shown: str) -> os.stat_result | None:
    """The target's lstat when it is a regular file, None when absent, else refused."""
    info = _lstat(dir_fd, name)
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise refused(shown, f"the target is {_kind(info.st_mode)}, not a regular file")
    return info


def _read_at(dir_fd: int, name: str, shown: str, max_bytes: int) -> bytes | None:
    before = _regular(dir_fd, name, shown)
    if before is None:
        return None
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise refused(shown, "the target became a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (
            before.st_dev,
            before.st_ino,
        ):
            raise refused(shown, "the target changed while it was opened")
        if info.st_size > max_bytes:
            raise refused(shown, f"the file has {info.st_size} bytes, more than {max_bytes}")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise refused(shown, f"the file grew beyond {max_bytes} bytes while read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_existing(base: Base, rel: str, max_bytes: int) -> bytes | None:
    """Content of the regular file ``rel`` under ``base``; None when it does not exist.

    Nothing is followed: a symlinked folder or target, a fifo, device, socket or
    directory at ``rel`` is refused, as is a file larger than ``max_bytes``.
    """
    with parent_dir(base, rel) as found:
        if found is None:
            return None
        return _read_at(found[0], found[1], rel, max_bytes)


def read_regular(base: Base, rel: str, max_bytes: int) -> bytes:
    """Like :func:`read_existing` for a file that must exist (a sandbox's output file)."""
    try:
        data = read_existing(base, "/".join(relative_parts(rel)), max_bytes)
    except MergeRefused as exc:
        raise refused(f"output file {rel}", exc.why) from None
    if data is None:
        raise refused(rel, "the output file does not exist")
    return data


def file_sha256(base: Base, rel: str, max_bytes: int) -> str | None:
    data = read_existing(base, rel, max_bytes)
    return None if data is None else hashlib.sha256(data).hexdigest()


class FileChanged(Exception):
    """:func:`write_atomic` with ``unchanged``: the file was not as expected just before
    the rename (somebody changed it meanwhile); nothing was written."""

    def __init__(self, found: str | None) -> None:
        super().__init__(f"the file changed meanwhile (now {found or 'absent'})")
        self.found = found


class TargetLocked(Exception):
    """:func:`write_atomic` with ``lock``: ``<name>.lock`` exists (git holds it)."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_atomic(
    base: Base,
    rel: str,
    data: bytes,
    *,
    mode: int | None = None,
    dir_mode: int | None = None,
    temp_name: str | None = None,
    sync_folder: bool = True,
    unchanged: tuple[str | None, int] | None = None,
    lock: bool = False,
    sync: bool = True,
) -> None:
    """Replace (or create) regular file ``rel`` with ``data``, atomically and durably.

    ``unchanged``: (SHA-256 or None for no file, the most bytes to read) the file must
    still have right before the rename, after the new data is on disk; otherwise
    :class:`FileChanged` is raised and nothing is written (a person's edit saved while the
    data was being synced is not replaced).  ``lock``: git's protocol, the data goes to
    ``<name>.lock``, created only if no other process holds it (else
    :class:`TargetLocked`), so a git command run meanwhile waits for it or fails.

    ``sync_folder=False`` leaves the rename itself to the file system's own flush: the
    data is on disk before the name points to it, so a machine crash can only leave the
    previous file (for state that repairs itself from what is there, as staging does).
    ``sync=False`` does not sync the data either: atomic for the processes that read it,
    not durable (a machine crash may leave the name pointing to an empty or partial
    file), for a file whose reader checks it against a hash kept elsewhere.

    The existing target must be a regular file (its permission bits and owner are kept
    unless ``mode`` is given; a new file gets ``mode`` or 0o666 minus the umask, and the
    folder's owner -- see :func:`_match_owner`).  The data goes
    to ``temp_name`` next to it first (default: a random ``.<name>.fluffy-<hex>.tmp``); a
    stale file of an explicit ``temp_name``, left by an interrupted write, is removed.
    """
    with parent_dir(base, rel, create=True, dir_mode=dir_mode) as found:
        assert found is not None  # create=True never yields None
        dir_fd, name = found
        current = _regular(dir_fd, name, rel)
        if mode is not None:
            final_mode = mode
        elif current is not None:
            final_mode = stat.S_IMODE(current.st_mode) & 0o777
        else:
            final_mode = None
        temp = f"{name}.lock" if lock else temp_name or f".{name}.fluffy-{secrets.token_hex(8)}.tmp"
        if temp_name is not None and not lock:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=dir_fd)
        try:
            fd = os.open(
                temp, _CREATE_FLAGS, 0o600 if final_mode is not None else 0o666, dir_fd=dir_fd
            )
        except FileExistsError:
            if lock:
                raise TargetLocked(f"{rel}.lock exists") from None
            raise
        try:
            try:
                _write_all(fd, data)
                if final_mode is not None:  # while the file is the kernel's: no CAP_FOWNER
                    os.fchmod(fd, final_mode)
                _match_owner(fd, current or os.fstat(dir_fd))  # clears S_ISUID/S_ISGID too
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if unchanged is not None:
                now = _read_at(dir_fd, name, rel, unchanged[1])
                digest = None if now is None else hashlib.sha256(now).hexdigest()
                if digest != unchanged[0]:
                    raise FileChanged(digest)
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        if sync_folder:
            os.fsync(dir_fd)


def remove_file(base: Base, rel: str) -> bool:
    """Unlink regular file ``rel`` (durably); False when it did not exist."""
    with parent_dir(base, rel) as found:
        if found is None:
            return False
        dir_fd, name = found
        if _regular(dir_fd, name, rel) is None:
            return False
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
        os.fsync(dir_fd)
        return True


def remove_stale(base: Base, rel: str, temp_name: str) -> None:
    """Remove ``temp_name`` beside ``rel`` if an interrupted write left it there."""
    with parent_dir(base, rel) as found:
        if found is not None:
            info = _lstat(found[0], temp_name)
            if info is not None and stat.S_ISREG(info.st_mode):
                os.unlink(temp_name, dir_fd=found[0])
