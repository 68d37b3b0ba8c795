"""The sandbox hardening, written once (ADR-049).

:func:`harden` turns a :class:`ContainerSpec` (which the container manager derives from
a :class:`~fluffy.kernel.containers.config.SandboxConfig`) into :class:`Hardening`: every
security-relevant setting of the container, engine-neutral.  Each runtime translates it
mechanically into its SDK call (``docker_runtime.docker_host_config`` and
``docker_container_config``; ``podman_runtime.podman_payload`` and ``podman_body``) and
decides nothing itself; ``tests/unit/kernel/containers/test_hardening.py`` maps both
translations back and checks they give this same :class:`Hardening`, and
``tests/integration/test_hardening_engines.py`` compares what the two engines report they
made.

What is not an option stays a constant here (read-only root, no capabilities,
no-new-privileges, no network, a private IPC namespace, no injected init, no swap beyond
the memory limit); the user, limits, seccomp profile and mounts come from the spec and
are checked (:func:`check_user`, :func:`check_mounts`, :func:`missing_profile`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fluffy.kernel.containers.runtime import (
    ContainerSpec,
    Mount,
    check_mounts,
    check_user,
    missing_profile,
)

#: Capabilities a sandbox keeps: none.
CAP_DROP = ("ALL",)
#: The only network namespace a sandbox gets: its own, with loopback only.  Network a
#: sandbox may use goes through a Unix socket the kernel owns.
NETWORK_MODE = "none"
#: Its own IPC namespace, shared with nobody.
IPC_MODE = "private"


@dataclass(frozen=True)
class Tmpfs:
    """A tmpfs mount and its options ("rw", "noexec", "size=64m", ...)."""

    target: str
    options: tuple[str, ...]

    @property
    def option_text(self) -> str:
        return ",".join(self.options)


@dataclass(frozen=True)
class Hardening:
    """Every security-relevant setting of one sandbox container, engine-neutral."""

    #: numeric "uid:gid", never root
    user: str
    memory_bytes: int
    nano_cpus: int
    pids_limit: int
    #: the profile's name (strict / standard / standard-net) and its OCI JSON or a file
    #: holding it: Docker takes the JSON inline, Podman reads a file
    seccomp_profile: str
    seccomp_json: str
    seccomp_path: Path | None
    #: bind mounts, sources resolved and checked (:func:`check_mounts`)
    binds: tuple[Mount, ...]
    tmpfs: tuple[Tmpfs, ...]
    read_only_rootfs: bool = True
    no_new_privileges: bool = True
    cap_drop: tuple[str, ...] = CAP_DROP
    cap_add: tuple[str, ...] = ()
    network_mode: str = NETWORK_MODE
    ipc_mode: str = IPC_MODE
    #: no engine-injected init process (docker-init / catatonit): the command is pid 1
    init: bool = False

    @property
    def memory_swap_bytes(self) -> int:
        """Memory plus swap: equal to the memory limit, i.e. no swap beyond it."""
        return self.memory_bytes

    @property
    def cpu_period_us(self) -> int:
        """The CFS period the CPU limit is expressed in (the engines' default, 100 ms)."""
        return 100_000

    @property
    def cpu_quota_us(self) -> int:
        """CPU time per :attr:`cpu_period_us` (what ``nano_cpus`` means to the kernel)."""
        return self.nano_cpus * self.cpu_period_us // 1_000_000_000


def harden(spec: ContainerSpec, *, seccomp: str) -> Hardening:
    """The hardening of ``spec``; ``seccomp``: which form of the profile the engine
    takes ("json" for Docker, "path" for Podman), refused if the spec lacks it."""
    if (seccomp == "json" and not spec.seccomp_json) or (
        seccomp == "path" and spec.seccomp_path is None
    ):
        raise missing_profile(spec)
    return Hardening(
        user=check_user(spec.user),
        memory_bytes=spec.memory_bytes,
        nano_cpus=spec.nano_cpus,
        pids_limit=spec.pids_limit,
        seccomp_profile=spec.seccomp_profile,
        seccomp_json=spec.seccomp_json if seccomp == "json" else "",
        seccomp_path=spec.seccomp_path if seccomp == "path" else None,
        binds=check_mounts(spec.mounts),
        tmpfs=tuple(
            Tmpfs(target, tuple(options.split(","))) for target, options in spec.tmpfs.items()
        ),
    )
