"""The ``ContainerRuntime`` protocol (design: Container Runtime Abstraction).

Implementations: :class:`~fluffy.kernel.containers.docker_runtime.DockerRuntime` (Docker
Engine API), :class:`~fluffy.kernel.containers.podman_runtime.PodmanRuntime` (Podman's own
API) and :class:`~fluffy.kernel.containers.memory_runtime.MemoryRuntime` (unit tests).

A runtime turns a :class:`ContainerSpec` into a container.  The security settings are
written once, in :mod:`~fluffy.kernel.containers.hardening` (read-only root, no
capabilities, no-new-privileges, the unprivileged user, no network, the limits, the
seccomp profile, checked mounts): each runtime only translates that description into its
engine's call; :func:`check_mounts` refuses any mount that could expose the engine.
"""

from __future__ import annotations

import enum
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec

from fluffy.errors import SandboxConfigError

#: Label keys every resource fluffy creates carries (the garbage collector's keys).
LABEL_MANAGED = "org.fluffy.managed"
LABEL_SESSION = "org.fluffy.session"
LABEL_SANDBOX = "org.fluffy.sandbox"
LABEL_TEMPLATE = "org.fluffy.template"
LABEL_PURPOSE = "org.fluffy.purpose"
#: The manager's state folder a sandbox was made under (the folder's random id,
#: :func:`root_label`): what ``collect_garbage`` may judge by that folder's session files.
LABEL_ROOT = "org.fluffy.root"


def root_label(root: Path) -> str:
    """LABEL_ROOT's value for a manager's state folder ``root`` (existing): a random id
    kept in ``root/id`` (every kernel in L1 sees its state at the same path, so the
    path itself would name them all alike)."""
    path = root / "id"
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        pass
    made = secrets.token_hex(8)
    temp = root / f".id.{made}.tmp"
    temp.write_text(made, encoding="ascii")
    try:
        os.link(temp, path)  # whole when it appears; the first manager's id wins
    except FileExistsError:
        made = path.read_text(encoding="ascii").strip()
    finally:
        temp.unlink()
    return made


#: The sandbox user of a kernel that runs as root (on a host, in development and tests).
SANDBOX_UID = 10001
SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"


def sandbox_identity() -> tuple[int, int]:
    """(uid, gid) every sandbox of this kernel runs as: the kernel's own when it is not
    root -- in L1 that is the project owner's (or, for a root-owned project, uid 10000),
    so a sandbox reads exactly what the user's project lets its owner read -- else
    :data:`SANDBOX_UID`.  Never root.  Each sandbox is still told apart from the others
    by its own socket, never by its uid."""
    uid, gid = os.geteuid(), os.getegid()
    if uid != 0:
        return uid, gid if gid != 0 else uid
    return SANDBOX_UID, SANDBOX_UID


def sandbox_user() -> str:
    uid, gid = sandbox_identity()
    return f"{uid}:{gid}"


def check_user(user: str) -> str:
    """Refuse a sandbox user that is root (by name or uid)."""
    name = user.split(":")[0]
    if name in ("", "0", "root") or not name.isdigit():
        raise SandboxConfigError(
            f"refusing to run a sandbox as {user!r}",
            why="sandboxes never run as root, and their user is a numeric uid",
            fix="Run the kernel as a user other than root.",
        )
    return user


class ContainerStatus(enum.StrEnum):
    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    EXITED = "exited"
    DEAD = "dead"
    MISSING = "missing"


class Mount(msgspec.Struct, frozen=True):
    """A bind mount: ``source`` is a path the *engine* can see (a host path)."""

    source: Path
    target: str
    read_only: bool = True


class ContainerSpec(msgspec.Struct, frozen=True):
    name: str
    image: str
    command: list[str]
    labels: dict[str, str]
    mounts: tuple[Mount, ...] = ()
    workdir: str | None = None
    environment: dict[str, str] = msgspec.field(default_factory=dict)
    memory_bytes: int = 512 * 1024 * 1024
    nano_cpus: int = 1_000_000_000
    pids_limit: int = 100
    seccomp_profile: str = "standard"
    seccomp_json: str = ""
    seccomp_path: Path | None = None
    tmpfs: dict[str, str] = msgspec.field(default_factory=dict)
    #: Numeric "uid:gid", never root (:func:`check_user`); the manager sets it.
    user: str = SANDBOX_USER


class ContainerState(msgspec.Struct, frozen=True):
    id: str
    status: ContainerStatus
    exit_code: int | None = None
    oom_killed: bool = False
    error: str = ""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    #: the id of the image the container was made from
    image_id: str = ""


class ExecResult(msgspec.Struct, frozen=True):
    exit_code: int
    stdout: str
    stderr: str


@runtime_checkable
class ContainerRuntime(Protocol):
    """What the container manager needs from an engine.

    The contract, which tests/runtime_conformance.py checks on every implementation:
    ``create`` applies :mod:`~fluffy.kernel.containers.hardening` and refuses what it
    refuses (:class:`SandboxConfigError`), a name in use and a missing image
    (``EngineOperationFailed``, ``ImageNotFound``); a container is CREATED (exit code
    0, no output) until started; ``wait`` returns the exit code (again if asked again)
    or raises ``EngineTimeout``; ``kill`` and a ``stop`` past its timeout leave it
    EXITED with 137; ``pause``, ``resume``, ``kill`` and ``run`` refuse a container
    not in the state they need (``EngineOperationFailed``); ``remove`` removes even a
    running one at once; a removed container is MISSING to ``inspect`` and
    ``EngineNotFound`` to everything else, a second ``remove`` included (the manager's
    destroy is what is idempotent); ``logs`` carries both streams, ``output`` each.
    """

    name: str
    #: Whether ``inspect`` sets ``oom_killed`` (else a SIGKILL nobody sent is read as OOM).
    reports_oom: bool

    def ping(self) -> bool: ...

    def create(self, spec: ContainerSpec) -> str: ...

    def start(self, container_id: str) -> None: ...

    def stop(self, container_id: str, timeout: int) -> None: ...

    def kill(self, container_id: str) -> None: ...

    def remove(self, container_id: str) -> None: ...

    def inspect(self, container_id: str) -> ContainerState: ...

    def image_id(self, ref: str) -> str: ...

    def pause(self, container_id: str) -> None: ...

    def resume(self, container_id: str) -> None: ...

    def wait(self, container_id: str, timeout: float) -> int: ...

    def run(self, container_id: str, command: list[str], timeout: float) -> ExecResult: ...

    def logs(self, container_id: str, *, follow: bool = False) -> Iterator[str]: ...

    def output(self, container_id: str) -> tuple[str, str]: ...

    def create_volume(self, name: str, labels: dict[str, str]) -> str: ...

    def remove_volume(self, name: str) -> None: ...

    def list_containers(self, labels: dict[str, str]) -> list[ContainerState]: ...

    def list_volumes(self, labels: dict[str, str]) -> dict[str, dict[str, str]]:
        """Volume name -> labels."""
        ...


def missing_profile(spec: ContainerSpec) -> SandboxConfigError:
    """The error every runtime raises for a spec without its seccomp profile."""
    return SandboxConfigError(
        f"container {spec.name} has no seccomp profile",
        why="fluffy never falls back to the engine's default profile",
        fix="Create sandboxes through the container manager.",
    )


#: Paths whose presence in a sandbox would hand it the engine (or the host).
_FORBIDDEN_SOURCES = ("/var/run", "/run", "/proc", "/sys", "/dev", "/etc", "/boot")


def check_mounts(mounts: tuple[Mount, ...]) -> tuple[Mount, ...]:
    """Refuse mounts that could expose the engine socket or the host's system folders.

    Returns the mounts with their sources resolved (symlinks followed), which is what
    must be handed to the engine: checking one path and mounting another is a TOCTOU.
    The check sees this process's file system; the manager runs it on its own paths
    before translating them for sibling containers.  It cannot see sockets *inside* a
    mounted project folder: a sandbox cannot use a socket it has no write permission on,
    and the escape probe looks for engine sockets.
    """
    checked: list[Mount] = []
    for mount in mounts:
        source = mount.source
        if not source.is_absolute():
            raise SandboxConfigError(
                f"mount source {source} is not an absolute path",
                why="the engine resolves bind mounts on the host, from absolute paths",
                fix="Pass an absolute host path.",
            )
        try:
            resolved = source.resolve()
        except OSError:  # a host path seen from L1: the manager checked its own path
            resolved = Path(os.path.normpath(source))
        text = str(resolved)
        if resolved == Path("/") or any(
            text == bad or text.startswith(bad + "/") for bad in _FORBIDDEN_SOURCES
        ):
            raise SandboxConfigError(
                f"refusing to mount {resolved} into a sandbox",
                why="system folders can expose the container engine's socket or the host",
                fix="Mount only the project directory and fluffy's output directories.",
            )
        try:
            is_socket = resolved.exists() and stat.S_ISSOCK(resolved.stat().st_mode)
        except OSError:  # not visible from here (see above)
            is_socket = False
        if is_socket:
            raise SandboxConfigError(
                f"refusing to mount the socket {resolved} into a sandbox",
                why="sandboxes never get an engine socket (or any host socket)",
                fix="Talk to the kernel through the socket it provides instead.",
            )
        if not mount.target.startswith("/") or mount.target in ("/", "/proc", "/sys", "/dev"):
            raise SandboxConfigError(
                f"mount target {mount.target!r} is not allowed",
                fix="Mount at /workspace, /output or another absolute, non-system path.",
            )
        checked.append(Mount(resolved, mount.target, mount.read_only))
    return tuple(checked)
