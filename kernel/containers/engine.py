"""Finding and connecting to the container engine (Docker or Podman).

Both engines are reached through the Docker-compatible HTTP API on a Unix socket
(Podman serves it from ``podman system service``).  Which engine and which socket:

1. ``FLUFFY_RUNTIME`` = ``docker`` | ``podman`` limits the search to one engine;
2. ``DOCKER_HOST`` (docker) and ``CONTAINER_HOST`` (podman) name a socket explicitly;
3. otherwise the engines' well-known sockets are tried, Docker first.

Only ``fluffy.kernel.containers`` talks to the engine socket (a layer rule, tested).
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from fluffy.errors import ConfigError, EngineUnavailable
from fluffy.kernel.containers.errors import engine_call

if TYPE_CHECKING:  # the SDK (and requests) load with the first connection, not the kernel
    import docker

EngineName = Literal["docker", "podman"]
ENGINES: tuple[EngineName, ...] = ("docker", "podman")

#: Seconds to wait for the engine's answer to one API call (builds stream longer).
API_TIMEOUT = 120


class Endpoint(msgspec.Struct, frozen=True):
    """A socket an engine may answer on, and how fluffy came to try it."""

    engine: EngineName
    url: str
    source: str


class EngineInfo(msgspec.Struct, frozen=True):
    """What ``fluffy doctor`` reports about the engine in use."""

    engine: EngineName
    version: str
    api_version: str
    url: str
    source: str
    cli: str | None
    arch: str
    os: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "version": self.version,
            "api_version": self.api_version,
            "socket": self.url,
            "found_by": self.source,
            "cli": self.cli,
            "arch": self.arch,
            "os": self.os,
        }


def _unix(path: str | Path) -> str:
    return f"unix://{path}"


def candidate_endpoints(env: dict[str, str] | None = None) -> list[Endpoint]:
    """Every endpoint worth trying, in order, without touching the network."""
    env = dict(os.environ if env is None else env)
    wanted = env.get("FLUFFY_RUNTIME", "").strip().lower()
    if wanted and wanted not in ENGINES:
        raise ConfigError(
            f"FLUFFY_RUNTIME={wanted!r} is not a container engine fluffy knows",
            why="fluffy drives Docker or Podman only",
            fix="Set FLUFFY_RUNTIME to `docker` or `podman`, or unset it to auto-detect.",
        )
    runtime_dir = env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    found: list[Endpoint] = []
    if wanted in ("", "docker"):
        if env.get("DOCKER_HOST"):
            found.append(Endpoint("docker", env["DOCKER_HOST"], "DOCKER_HOST"))
        else:
            found.append(Endpoint("docker", _unix("/var/run/docker.sock"), "default socket"))
            found.append(
                Endpoint("docker", _unix(f"{runtime_dir}/docker.sock"), "rootless default socket")
            )
    if wanted in ("", "podman"):
        if env.get("CONTAINER_HOST"):
            found.append(Endpoint("podman", env["CONTAINER_HOST"], "CONTAINER_HOST"))
        else:
            found.append(Endpoint("podman", _unix("/run/podman/podman.sock"), "default socket"))
            found.append(
                Endpoint(
                    "podman", _unix(f"{runtime_dir}/podman/podman.sock"), "rootless default socket"
                )
            )
    return found


def _probe_socket(url: str) -> str | None:
    """Why the Unix socket cannot take a connection, or None if it can.

    Probing first gives a precise reason (no socket / refused: the daemon is stopped)
    and spares the SDK's connection path, which leaks its socket on refusal.
    """
    if not url.startswith("unix://"):
        return None  # tcp:// or ssh:// endpoints: the client finds out
    path = url.removeprefix("unix://")
    if not Path(path).exists():
        return "no socket"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        try:
            probe.connect(path)
        except OSError as exc:
            return f"{exc.strerror or exc}".lower()
    return None


class Engine:
    """A connected engine.  Thin: the container manager builds on it."""

    def __init__(self, client: docker.DockerClient, info: EngineInfo) -> None:
        self.client = client
        self.info = info

    @property
    def name(self) -> EngineName:
        return self.info.engine

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connect_endpoint(endpoint: Endpoint, timeout: int) -> Engine:
    import docker

    with engine_call(f"connect to {endpoint.engine} at {endpoint.url}"):
        client = docker.DockerClient(base_url=endpoint.url, version="auto", timeout=timeout)
    try:
        with engine_call(f"query {endpoint.engine} at {endpoint.url}"):
            version: dict[str, Any] = client.version()
    except BaseException:
        client.close()
        raise
    components = {c.get("Name", ""): c for c in version.get("Components", []) or []}
    engine: EngineName = "podman" if "Podman Engine" in components else "docker"
    info = EngineInfo(
        engine=engine,
        version=str(
            components.get("Podman Engine", components.get("Engine", {})).get("Version")
            or version.get("Version", "?")
        ),
        api_version=str(version.get("ApiVersion", "?")),
        url=endpoint.url,
        source=endpoint.source,
        cli=shutil.which(engine),
        arch=str(version.get("Arch", "?")),
        os=str(version.get("Os", "?")),
    )
    return Engine(client, info)


def connect(env: dict[str, str] | None = None, timeout: int = API_TIMEOUT) -> Engine:
    """Connect to the first engine that answers, or explain how to get one."""
    tried: list[str] = []
    for endpoint in candidate_endpoints(env):
        problem = _probe_socket(endpoint.url)
        if problem:
            tried.append(f"{endpoint.engine}: {endpoint.url} ({problem})")
            continue
        try:
            return _connect_endpoint(endpoint, timeout)
        except EngineUnavailable as exc:
            tried.append(f"{endpoint.engine}: {endpoint.url} ({exc.what.rsplit(': ', 1)[-1]})")
    denied = access_denied(tried)
    if denied is not None:
        raise denied
    raise EngineUnavailable(
        "no container engine answers",
        why="fluffy needs Docker or Podman: every sandbox is a container. Tried: "
        + "; ".join(tried),
        fix=_start_hint() or install_guide(),
    )


#: How a person who may not use the engine's socket gets an engine (ENVIRONMENT: the
#: docker group is root-equivalent, which is why rootless Podman is offered beside it).
ACCESS_FIX = (
    "Either join the docker group: `sudo usermod -aG docker $USER`, then log out and in "
    "(or `newgrp docker` in this shell); its members can run any container, as root "
    "can. Or use rootless Podman, which needs no group: `sudo apt install podman`, "
    "`systemctl --user enable --now podman.socket`, then `export FLUFFY_RUNTIME=podman`."
)


def access_denied(tried: list[str]) -> EngineUnavailable | None:
    """The error for an engine that runs but whose socket this user may not open (None:
    no socket refused this user).  ``tried``: ``engine: url (problem)`` lines."""
    denied = [line for line in tried if "permission denied" in line.lower()]
    if not denied:
        return None
    return EngineUnavailable(
        "a container engine runs here, but its socket is not open to you",
        why=f"{'; '.join(denied)}: user {_user()} is not in the group that may use it",
        fix=ACCESS_FIX,
    )


def engine_access_problem(env: dict[str, str] | None = None) -> EngineUnavailable | None:
    """Before a start: every engine socket that exists refuses this user (None: one
    may answer, or there is none, which the start itself reports)."""
    tried: list[str] = []
    for endpoint in candidate_endpoints(env):
        problem = _probe_socket(endpoint.url)
        if problem == "no socket":
            continue
        if problem is None or "permission denied" not in problem:
            return None  # it answers, or fails otherwise: the start itself says how
        tried.append(f"{endpoint.engine}: {endpoint.url} ({problem})")
    return access_denied(tried)


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _start_hint() -> str | None:
    """When an engine is installed but not running, say how to start it."""
    if shutil.which("dockerd"):
        return (
            "Docker is installed but its daemon is not running: `sudo systemctl start docker` "
            "(without systemd: `sudo dockerd &`), or run `scripts/setup` as root."
        )
    if shutil.which("podman"):
        return (
            "Podman is installed but its API service is not running: `systemctl --user start "
            "podman.socket` (as root: `podman system service --time=0 "
            "unix:///run/podman/podman.sock &`), then set FLUFFY_RUNTIME=podman."
        )
    return None


def install_guide(platform: str | None = None) -> str:
    """The design's platform-specific install guide (also printed by bootstrap)."""
    import sys

    platform = platform or sys.platform
    if platform == "darwin":
        return "Install Docker Desktop: `brew install --cask docker`, then start it once."
    if platform.startswith("win"):
        return (
            "Use WSL2 with Docker Desktop: `wsl --install`, install Docker Desktop with the WSL2 "
            "backend, then run fluffy inside your WSL2 distribution."
        )
    return (
        "Debian/Ubuntu: `sudo apt install docker.io && sudo systemctl start docker` "
        "(or run `scripts/setup` as root); Fedora/RHEL: `sudo dnf install podman && "
        "systemctl --user start podman.socket`. If the engine is installed, start it and "
        "check `docker info`."
    )
