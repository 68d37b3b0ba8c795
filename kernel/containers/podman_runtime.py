"""``ContainerRuntime`` on Podman's own API (podman SDK, libpod endpoints).

Podman differs from Docker in two ways that matter here: the seccomp profile is given
as a path the Podman service reads (not inline JSON), and tmpfs mounts are mounts (sent
with all their options: the SDK would keep only size and mode).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from podman.api import prepare_body
from podman.errors import ImageNotFound as PodmanImageNotFound

from fluffy.errors import EngineNotFound, EngineOperationFailed, ImageNotFound
from fluffy.kernel.containers.errors import engine_call
from fluffy.kernel.containers.hardening import Hardening, harden
from fluffy.kernel.containers.runtime import (
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    ExecResult,
)

_STATUS = {
    "configured": ContainerStatus.CREATED,
    "created": ContainerStatus.CREATED,
    "initialized": ContainerStatus.CREATED,
    "running": ContainerStatus.RUNNING,
    "paused": ContainerStatus.PAUSED,
    "exited": ContainerStatus.EXITED,
    "stopped": ContainerStatus.EXITED,
}


#: How long Podman's answer to a stop may take beyond the grace period (seconds).
STOP_ANSWER_S = 30
# Podman 4 answers a lookup made while the container's process is exiting with a 500
# ("read /proc/N/cgroup: no such process"); asked again a moment later, it answers.
EXITING = "no such process"
LOOKUP_RETRY_S = (0.05, 0.1, 0.2, 0.4)


def _bytes(data: bytes | Iterator[bytes]) -> bytes:
    return data if isinstance(data, bytes) else b"".join(data)


def _listed_state(attrs: dict[str, Any]) -> ContainerState:
    """A container from the libpod list endpoint (its State is a plain string)."""
    state = attrs.get("State", "")
    status = state.get("Status", "") if isinstance(state, dict) else state
    return ContainerState(
        id=str(attrs.get("Id", "")),
        status=_STATUS.get(str(status).lower(), ContainerStatus.DEAD),
        labels=dict(attrs.get("Labels") or {}),
    )


#: Podman's tmpfs option for "start empty" (its default copies the image's files in).
TMPFS_EMPTY = "notmpcopyup"


def podman_payload(hardening: Hardening) -> dict[str, Any]:
    """The podman SDK's create keywords for ``hardening`` (a mechanical mapping: every
    decision is :func:`~fluffy.kernel.containers.hardening.harden`'s).  Podman has no
    ``network_disabled`` (the SDK drops it): its network namespace "none" is the same
    thing, a namespace with loopback only."""
    return {
        "user": hardening.user,
        "mounts": [
            {"type": "bind", "source": str(m.source), "target": m.target, "read_only": m.read_only}
            for m in hardening.binds
        ],
        "network_mode": hardening.network_mode,
        "read_only": hardening.read_only_rootfs,
        "no_new_privileges": hardening.no_new_privileges,
        "cap_drop": list(hardening.cap_drop),
        "cap_add": list(hardening.cap_add),
        "mem_limit": hardening.memory_bytes,
        "memswap_limit": hardening.memory_swap_bytes,
        # the SDK drops nano_cpus without a word: the limit as the CFS quota it means
        "cpu_period": hardening.cpu_period_us,
        "cpu_quota": hardening.cpu_quota_us,
        "pids_limit": hardening.pids_limit,
        "ipc_mode": hardening.ipc_mode,
        "seccomp_profile_path": str(hardening.seccomp_path),
        "init": hardening.init,
    }


def podman_body(body: dict[str, Any], hardening: Hardening) -> dict[str, Any]:
    """The SDK's rendered request, completed with what the SDK cannot say: tmpfs mounts
    with all their options (it keeps only size and mode: noexec would be dropped, and the
    tmpfs left executable), and empty: Podman copies the image's files at the target into
    a tmpfs unless told ``notmpcopyup``; Docker never does."""
    return {
        **body,
        "mounts": [
            *(body.get("mounts") or []),
            *(
                {
                    "destination": t.target,
                    "type": "tmpfs",
                    "source": "tmpfs",
                    "options": [*t.options, TMPFS_EMPTY],
                }
                for t in hardening.tmpfs
            ),
        ],
    }


class PodmanRuntime:
    name = "podman"
    #: Podman 4.3 with hybrid cgroups never sets State.OOMKilled (measured here); the
    #: manager then reads an unexplained SIGKILL as the memory limit.
    reports_oom = False

    def __init__(self, base_url: str) -> None:
        from podman import PodmanClient

        with engine_call(f"connect to podman at {base_url}"):
            self._client = PodmanClient(base_url=base_url, timeout=120)
        #: Rootless Podman maps container uid N to a subordinate host uid: a sandbox
        #: running as the caller's uid could not use the caller's own folders, and the
        #: kernel's peer-uid check would see a stranger.  keep-id maps the caller's uid to
        #: itself (nothing else changes: still non-root, no capabilities).
        with engine_call(f"ask podman at {base_url} whether it is rootless"):
            info = self._client.info()  # type: ignore[no-untyped-call]
        self.rootless = bool(info.get("host", {}).get("security", {}).get("rootless"))

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    def ping(self) -> bool:
        with engine_call("ping podman"):
            return bool(self._client.ping())

    def create(self, spec: ContainerSpec) -> str:
        hardening = harden(spec, seccomp="path")
        payload: dict[str, Any] = {
            "image": spec.image,
            "command": spec.command,
            "name": spec.name,
            "working_dir": spec.workdir,
            "environment": spec.environment,
            "labels": spec.labels,
            **podman_payload(hardening),
        }
        if self.rootless:
            payload["userns_mode"] = "keep-id"
        action = f"create container {spec.name} from {spec.image}"
        try:
            with engine_call(action):
                body = podman_body(self._client.containers._render_payload(payload), hardening)
                response = self._client.api.post(
                    "/containers/create",
                    headers={"content-type": "application/json"},
                    data=prepare_body(body),
                )
                response.raise_for_status(not_found=PodmanImageNotFound)
                return str(response.json()["Id"])
        except EngineOperationFailed as exc:
            # Podman answers a missing image with a 500 ("image not known"), Docker
            # with a 404: tell it apart by asking, as Docker's answer would
            with engine_call(f"look up image {spec.image}"):
                present = self._client.images.exists(spec.image)
            if not present:
                raise ImageNotFound(f"cannot {action}: image not found") from exc
            raise

    def _get(self, container_id: str) -> Any:
        for delay in (*LOOKUP_RETRY_S, None):
            try:
                with engine_call(f"find container {container_id[:12]}"):
                    return self._client.containers.get(container_id)
            except EngineOperationFailed as exc:
                if delay is None or EXITING not in exc.what:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")  # (the last attempt returns or raises)

    def start(self, container_id: str) -> None:
        container = self._get(container_id)
        with engine_call(f"start container {container_id[:12]}"):
            container.start()

    def stop(self, container_id: str, timeout: int) -> None:
        self._get(container_id)  # a missing one: EngineNotFound, as for every call
        with engine_call(f"stop container {container_id[:12]}"):
            # the SDK waits 1.5 x the grace period for Podman's answer, which on a busy
            # machine comes later (the kill after the grace period, then the clean-up):
            # the answer gets the grace period and STOP_ANSWER_S
            action = "stop"
            response = self._client.api.post(
                f"/containers/{container_id}/{action}",
                params={"timeout": timeout},
                timeout=timeout + STOP_ANSWER_S,
            )
            response.raise_for_status()

    def kill(self, container_id: str) -> None:
        container = self._get(container_id)
        with engine_call(f"kill container {container_id[:12]}"):
            container.kill()

    def remove(self, container_id: str) -> None:
        with engine_call(f"remove container {container_id[:12]}"):
            # the SDK's remove cannot say timeout=0: Podman would give a running
            # container 10 s to stop, Docker kills it at once
            response = self._client.api.delete(
                f"/containers/{container_id}",
                params={"force": True, "volumes": True, "timeout": 0},
            )
            response.raise_for_status()

    def inspect(self, container_id: str) -> ContainerState:
        try:
            container = self._get(container_id)
        except EngineNotFound:
            return ContainerState(container_id, ContainerStatus.MISSING)
        with engine_call(f"inspect container {container_id[:12]}"):
            data: dict[str, Any] = container.inspect()
        state = data.get("State", {})
        return ContainerState(
            id=str(data["Id"]),
            status=_STATUS.get(str(state.get("Status", "")).lower(), ContainerStatus.DEAD),
            exit_code=state.get("ExitCode"),
            oom_killed=bool(state.get("OOMKilled")),
            error=str(state.get("Error") or ""),
            labels=dict(data.get("Config", {}).get("Labels") or {}),
            image_id=_image_id(str(data.get("Image") or "")),
        )

    def image_id(self, ref: str) -> str:
        with engine_call(f"inspect image {ref}"):
            return _image_id(str(self._client.images.get(ref).id))

    def pause(self, container_id: str) -> None:
        container = self._get(container_id)
        with engine_call(f"pause container {container_id[:12]}"):
            container.pause()

    def resume(self, container_id: str) -> None:
        container = self._get(container_id)
        with engine_call(f"resume container {container_id[:12]}"):
            container.unpause()

    def wait(self, container_id: str, timeout: float) -> int:
        container = self._get(container_id)
        with engine_call(f"wait for container {container_id[:12]}"):
            return int(container.wait(condition=["exited", "stopped"], timeout=timeout))

    def run(self, container_id: str, command: list[str], timeout: float) -> ExecResult:
        container = self._get(container_id)
        with engine_call(f"exec in container {container_id[:12]}"):
            code, output = container.exec_run(command, demux=True)  # as the container's user
        stdout, stderr = output if isinstance(output, tuple) else (output, b"")
        return ExecResult(
            exit_code=int(code if code is not None else -1),
            stdout=(stdout or b"").decode("utf-8", "replace"),
            stderr=(stderr or b"").decode("utf-8", "replace"),
        )

    def logs(self, container_id: str, *, follow: bool = False) -> Iterator[str]:
        container = self._get(container_id)
        with engine_call(f"read logs of container {container_id[:12]}"):
            if not follow:
                yield _bytes(container.logs(stream=False)).decode("utf-8", "replace")
                return
            for chunk in container.logs(stream=True, follow=True):
                yield chunk.decode("utf-8", "replace")

    def output(self, container_id: str) -> tuple[str, str]:
        container = self._get(container_id)
        with engine_call(f"read logs of container {container_id[:12]}"):
            out = _bytes(container.logs(stdout=True, stderr=False, stream=False))
            err = _bytes(container.logs(stdout=False, stderr=True, stream=False))
        return out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def create_volume(self, name: str, labels: dict[str, str]) -> str:
        with engine_call(f"create volume {name}"):
            self._client.volumes.create(name, labels=labels)
        return name

    def remove_volume(self, name: str) -> None:
        with engine_call(f"remove volume {name}"):
            self._client.volumes.remove(name, force=True)

    def list_containers(self, labels: dict[str, str]) -> list[ContainerState]:
        filters = [f"label={k}={v}" for k, v in labels.items()]  # podman SDK's list form
        with engine_call("list containers"):
            found = self._client.containers.list(all=True, filters=filters)
        return [_listed_state(c.attrs) for c in found]

    def list_volumes(self, labels: dict[str, str]) -> dict[str, dict[str, str]]:
        filters = [f"label={k}={v}" for k, v in labels.items()]  # podman SDK's list form
        with engine_call("list volumes"):
            found = self._client.volumes.list(filters=filters)
        return {str(v.name): dict(v.attrs.get("Labels") or {}) for v in found}


def _image_id(value: str) -> str:
    """Podman's image ids with and without the digest's name, as Docker spells them."""
    return value if value.startswith("sha256:") or not value else f"sha256:{value}"
