"""``ContainerRuntime`` on the Docker Engine API (docker SDK, low-level client)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import docker

from fluffy.errors import EngineNotFound
from fluffy.kernel.containers.errors import engine_call
from fluffy.kernel.containers.hardening import Hardening, harden
from fluffy.kernel.containers.runtime import (
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    ExecResult,
)


def _status(value: str) -> ContainerStatus:
    try:
        return ContainerStatus(value)
    except ValueError:
        return ContainerStatus.DEAD  # "removing", "restarting": not a state fluffy uses


def docker_container_config(hardening: Hardening) -> dict[str, Any]:
    """The container-level keywords of ``create_container`` for ``hardening``."""
    return {
        "user": hardening.user,
        # Config.NetworkDisabled, beside NetworkMode none: Docker's own "no network"
        "network_disabled": hardening.network_mode == "none",
    }


def docker_host_config(hardening: Hardening) -> dict[str, Any]:
    """The keywords of ``create_host_config`` for ``hardening`` (a mechanical mapping:
    every decision is :func:`~fluffy.kernel.containers.hardening.harden`'s)."""
    security_opt = [f"no-new-privileges:{str(hardening.no_new_privileges).lower()}"]
    security_opt.append(f"seccomp={hardening.seccomp_json}")
    return {
        "binds": {
            str(m.source): {"bind": m.target, "mode": "ro" if m.read_only else "rw"}
            for m in hardening.binds
        },
        "tmpfs": {t.target: t.option_text for t in hardening.tmpfs},
        "mem_limit": hardening.memory_bytes,
        "memswap_limit": hardening.memory_swap_bytes,
        "nano_cpus": hardening.nano_cpus,
        "pids_limit": hardening.pids_limit,
        "network_mode": hardening.network_mode,
        "read_only": hardening.read_only_rootfs,
        "cap_drop": list(hardening.cap_drop),
        "cap_add": list(hardening.cap_add) or None,
        "security_opt": security_opt,
        "ipc_mode": hardening.ipc_mode,
        "init": hardening.init,
    }


class DockerRuntime:
    """Docker Engine (also usable against Podman's compatible socket)."""

    name = "docker"
    reports_oom = True

    def __init__(self, client: docker.DockerClient, url: str | None = None) -> None:
        self._api = client.api
        self._url = url
        self._streaming: docker.APIClient | None = None

    def _stream_api(self) -> docker.APIClient:
        """A client without a read timeout, for following logs through long silences."""
        if self._url is None:
            return self._api
        if self._streaming is None:
            with engine_call("connect for log streaming"):
                self._streaming = docker.APIClient(
                    base_url=self._url,
                    version=self._api.api_version,
                    timeout=None,  # type: ignore[arg-type]  # requests: no read timeout
                )
        return self._streaming

    def ping(self) -> bool:
        with engine_call("ping the engine"):
            return bool(self._api.ping())

    def host_config(self, spec: ContainerSpec) -> dict[str, Any]:
        hardening = harden(spec, seccomp="json")
        config: dict[str, Any] = self._api.create_host_config(**docker_host_config(hardening))
        return config

    def create(self, spec: ContainerSpec) -> str:
        hardening = harden(spec, seccomp="json")
        with engine_call(f"create container {spec.name} from {spec.image}"):
            created = self._api.create_container(
                spec.image,
                command=spec.command,
                name=spec.name,
                working_dir=spec.workdir,
                environment=spec.environment,
                labels=spec.labels,
                **docker_container_config(hardening),
                host_config=self._api.create_host_config(**docker_host_config(hardening)),
            )
        return str(created["Id"])

    def start(self, container_id: str) -> None:
        with engine_call(f"start container {container_id[:12]}"):
            self._api.start(container_id)

    def stop(self, container_id: str, timeout: int) -> None:
        with engine_call(f"stop container {container_id[:12]}"):
            self._api.stop(container_id, timeout=timeout)

    def kill(self, container_id: str) -> None:
        with engine_call(f"kill container {container_id[:12]}"):
            self._api.kill(container_id)

    def remove(self, container_id: str) -> None:
        with engine_call(f"remove container {container_id[:12]}"):
            self._api.remove_container(container_id, force=True, v=True)

    def inspect(self, container_id: str) -> ContainerState:
        try:
            with engine_call(f"inspect container {container_id[:12]}"):
                data: dict[str, Any] = self._api.inspect_container(container_id)
        except EngineNotFound:
            return ContainerState(container_id, ContainerStatus.MISSING)
        state = data.get("State", {})
        return ContainerState(
            id=str(data["Id"]),
            status=_status(str(state.get("Status", "dead"))),
            exit_code=state.get("ExitCode"),
            oom_killed=bool(state.get("OOMKilled")),
            error=str(state.get("Error") or ""),
            labels=dict(data.get("Config", {}).get("Labels") or {}),
            image_id=str(data.get("Image") or ""),
        )

    def image_id(self, ref: str) -> str:
        with engine_call(f"inspect image {ref}"):
            return str(self._api.inspect_image(ref)["Id"])  # type: ignore[no-untyped-call]

    def pause(self, container_id: str) -> None:
        with engine_call(f"pause container {container_id[:12]}"):
            self._api.pause(container_id)

    def resume(self, container_id: str) -> None:
        with engine_call(f"resume container {container_id[:12]}"):
            self._api.unpause(container_id)

    def wait(self, container_id: str, timeout: float) -> int:
        """The exit code; :class:`EngineTimeout` if still running after ``timeout`` s."""
        with engine_call(f"wait for container {container_id[:12]}"):
            result = self._api.wait(container_id, timeout=timeout)  # type: ignore[arg-type]
        return int(result.get("StatusCode", -1))

    def run(self, container_id: str, command: list[str], timeout: float) -> ExecResult:
        with engine_call(f"exec in container {container_id[:12]}"):
            exec_id = self._api.exec_create(container_id, command)["Id"]  # as the container's user
            out = self._api.exec_start(exec_id, demux=True)
            code = self._api.exec_inspect(exec_id).get("ExitCode")
        stdout, stderr = out if isinstance(out, tuple) else (out, b"")
        return ExecResult(
            exit_code=int(code if code is not None else -1),
            stdout=(stdout or b"").decode("utf-8", "replace"),
            stderr=(stderr or b"").decode("utf-8", "replace"),
        )

    def logs(self, container_id: str, *, follow: bool = False) -> Iterator[str]:
        with engine_call(f"read logs of container {container_id[:12]}"):
            if not follow:
                data = self._api.logs(container_id, stdout=True, stderr=True)
                yield data.decode("utf-8", "replace")
                return
            for chunk in self._stream_api().logs(container_id, stream=True, follow=True):
                yield chunk.decode("utf-8", "replace")

    def output(self, container_id: str) -> tuple[str, str]:
        """(stdout, stderr) of a finished container."""
        with engine_call(f"read logs of container {container_id[:12]}"):
            out = self._api.logs(container_id, stdout=True, stderr=False)
            err = self._api.logs(container_id, stdout=False, stderr=True)
        return out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def create_volume(self, name: str, labels: dict[str, str]) -> str:
        with engine_call(f"create volume {name}"):
            self._api.create_volume(name=name, labels=labels)
        return name

    def remove_volume(self, name: str) -> None:
        with engine_call(f"remove volume {name}"):
            self._api.remove_volume(name, force=True)

    def list_containers(self, labels: dict[str, str]) -> list[ContainerState]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        with engine_call("list containers"):
            found: list[dict[str, Any]] = self._api.containers(all=True, filters=filters)
        return [
            ContainerState(
                id=str(item["Id"]),
                status=_status(str(item.get("State", "dead"))),
                labels=dict(item.get("Labels") or {}),
            )
            for item in found
        ]

    def list_volumes(self, labels: dict[str, str]) -> dict[str, dict[str, str]]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        with engine_call("list volumes"):
            found: dict[str, Any] = self._api.volumes(filters=filters)
        return {str(v["Name"]): dict(v.get("Labels") or {}) for v in found.get("Volumes") or []}
