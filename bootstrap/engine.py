"""Find the container engine and talk to its API over its Unix socket (stdlib only)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import fluffy.errors as errors  # the one error tree (standard library only, like the bootstrap)
from fluffy.gate import wire

API = "/v1.41"
SOCKETS = {
    "docker": ("/var/run/docker.sock", "/run/docker.sock"),
    "podman": ("/run/podman/podman.sock", f"/run/user/{os.getuid()}/podman/podman.sock"),
}


def as_dict(error: errors.FluffyError) -> dict[str, str]:
    """The bootstrap's shape of an error (JSON on stderr, the status file): 4 fields."""
    return {"code": error.code, "what": error.what, "why": error.why, "fix": error.fix}


def install_guide() -> str:
    """The design's platform-specific install guide."""
    system = platform.system()
    if system == "Darwin":
        return "Install Docker Desktop (or `brew install podman && podman machine start`)."
    if "microsoft" in platform.release().lower():
        return "Install Docker Desktop for Windows with the WSL2 backend, or podman in WSL2."
    if Path("/etc/debian_version").exists():
        return "Run `sudo apt-get install -y docker.io` and start dockerd (or install podman)."
    if Path("/etc/fedora-release").exists() or Path("/etc/redhat-release").exists():
        return "Run `sudo dnf install -y podman` (or install Docker Engine)."
    return "Install Docker Engine or Podman and start it (https://docs.docker.com/engine/install/)."


class Engine:
    def __init__(self, kind: str, socket_path: str) -> None:
        self.kind, self.socket_path = kind, socket_path

    def call(
        self, method: str, path: str, body: Any = None, timeout: float = 60.0, raw: bool = False
    ) -> Any:
        payload = b"" if body is None else json.dumps(body).encode()
        try:
            _, status, raw_data = wire.request(
                self.socket_path, method, API + path, payload, timeout
            )
        except OSError as exc:
            raise errors.EngineUnavailable(
                f"the {self.kind} engine at {self.socket_path} failed: {exc}",
                why="",
                fix="Check that the engine is running.",
            ) from None
        if raw and status < 400:
            return raw_data
        as_json = raw_data[:1] in (b"{", b"[")
        data = json.loads(raw_data) if as_json else raw_data.decode(errors="replace")
        if status >= 400:
            message = data.get("message", data) if isinstance(data, dict) else data
            what = f"{method} {path}: {status} {message}"
            raise errors.EngineOperationFailed(what, why="", fix="")
        return data


def _candidates(env: dict[str, str]) -> list[tuple[str, str]]:
    wanted = env.get("FLUFFY_RUNTIME", "").strip().lower()
    kinds = [wanted] if wanted else ["docker", "podman"]
    if wanted and wanted not in SOCKETS:
        raise errors.ConfigError(
            f"FLUFFY_RUNTIME={wanted!r} is not docker or podman",
            why="",
            fix="Set FLUFFY_RUNTIME to docker or podman, or unset it.",
        )
    found = []
    host = env.get("DOCKER_HOST", "")
    if host.startswith("unix://") and "docker" in kinds:
        found.append(("docker", host[len("unix://") :]))
    for kind in kinds:
        found.extend((kind, path) for path in SOCKETS[kind])
    return found


def detect(env: dict[str, str]) -> Engine:
    """The first engine that answers /_ping (FLUFFY_RUNTIME chooses one)."""
    for kind, path in _candidates(env):
        if not Path(path).exists():
            continue
        engine = Engine(kind, path)
        try:
            engine.call("GET", "/_ping", timeout=5)
        except errors.EngineError:
            continue
        return engine
    raise errors.EngineUnavailable(
        "no container engine answers",
        why="fluffy runs its kernel and sandboxes in containers (Docker or Podman)",
        fix=install_guide(),
    )
