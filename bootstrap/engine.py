"""Find the container engine and talk to its API over its Unix socket (stdlib only)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from fluffy.gate import wire

API = "/v1.41"
SOCKETS = {
    "docker": ("/var/run/docker.sock", "/run/docker.sock"),
    "podman": ("/run/podman/podman.sock", f"/run/user/{os.getuid()}/podman/podman.sock"),
}


class BootstrapError(Exception):
    """A structured failure: code, what, why, fix (printed as JSON or ERROR/Reason/Fix)."""

    def __init__(self, code: str, what: str, why: str = "", fix: str = "") -> None:
        super().__init__(what)
        self.code, self.what, self.why, self.fix = code, what, why, fix

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "what": self.what, "why": self.why, "fix": self.fix}


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
            raise BootstrapError(
                "engine.unavailable",
                f"the {self.kind} engine at {self.socket_path} failed: {exc}",
                fix="Check that the engine is running.",
            ) from None
        if raw and status < 400:
            return raw_data
        as_json = raw_data[:1] in (b"{", b"[")
        data = json.loads(raw_data) if as_json else raw_data.decode(errors="replace")
        if status >= 400:
            message = data.get("message", data) if isinstance(data, dict) else data
            raise BootstrapError("engine.operation_failed", f"{method} {path}: {status} {message}")
        return data


def _candidates(env: dict[str, str]) -> list[tuple[str, str]]:
    wanted = env.get("FLUFFY_RUNTIME", "").strip().lower()
    kinds = [wanted] if wanted else ["docker", "podman"]
    if wanted and wanted not in SOCKETS:
        raise BootstrapError(
            "config.invalid",
            f"FLUFFY_RUNTIME={wanted!r} is not docker or podman",
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
        except BootstrapError:
            continue
        return engine
    raise BootstrapError(
        "engine.unavailable",
        "no container engine answers",
        why="fluffy runs its kernel and sandboxes in containers (Docker or Podman)",
        fix=install_guide(),
    )
