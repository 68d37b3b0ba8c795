"""An in-memory ``ContainerRuntime`` for unit tests of the container manager.

Nothing runs: each created container gets a :class:`Behaviour` from a callback (exit
code, output, how long it "runs", OOM), an exec gets its result from another, and any
method can be made to fail once or always.  Otherwise it keeps the contract the real
engines keep (tests/runtime_conformance.py, run against Docker, Podman and this one):
the same hardening refusals, the same errors for missing containers and images and for
operations a container's state does not allow, output only once it has run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fluffy.errors import (
    EngineNotFound,
    EngineOperationFailed,
    EngineTimeout,
    FluffyError,
    ImageNotFound,
)
from fluffy.kernel.containers.hardening import harden
from fluffy.kernel.containers.runtime import (
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    ExecResult,
)


@dataclass
class Behaviour:
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    oom: bool = False


@dataclass
class FakeContainer:
    spec: ContainerSpec
    behaviour: Behaviour
    status: ContainerStatus = ContainerStatus.CREATED
    exit_code: int | None = None
    image_id: str = ""
    #: whether it was ever started (an engine has no output of a container before)
    started: bool = False


def _exec_nothing(container: FakeContainer, command: list[str]) -> ExecResult:
    return ExecResult(0, "", "")


@dataclass
class MemoryRuntime:
    behave: Callable[[ContainerSpec], Behaviour] = lambda _spec: Behaviour()
    #: the result of ``run`` (an exec) in a running container
    execute: Callable[[FakeContainer, list[str]], ExecResult] = _exec_nothing
    failures: dict[str, FluffyError] = field(default_factory=dict)
    containers: dict[str, FakeContainer] = field(default_factory=dict)
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    #: image reference -> its id; only these exist (:meth:`add_image`; a test
    #: "rebuilds" an image by changing its id)
    images: dict[str, str] = field(default_factory=dict)
    name: str = "memory"
    reports_oom: bool = True
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def add_image(self, ref: str) -> str:
        """Make ``ref`` exist (as if built); return its id."""
        return self.images.setdefault(ref, f"sha256:{len(self.images):064x}")

    def _call(self, method: str, target: str) -> None:
        self.calls.append((method, target))
        if method in self.failures:
            raise self.failures[method]

    def _get(self, container_id: str, action: str = "find") -> FakeContainer:
        try:
            return self.containers[container_id]
        except KeyError:
            raise EngineNotFound(
                f"cannot {action} container {container_id[:12]}: not found (no such container)"
            ) from None

    def _refuse(self, container: FakeContainer, action: str, container_id: str) -> None:
        raise EngineOperationFailed(
            f"cannot {action} container {container_id[:12]}: it is {container.status}",
            why="the container engine refused the request",
            fix="Check the container's state (`docker ps -a`), then retry.",
        )

    def ping(self) -> bool:
        return True

    def create(self, spec: ContainerSpec) -> str:
        self._call("create", spec.name)
        harden(spec, seccomp="json" if spec.seccomp_json else "path")
        if any(c.spec.name == spec.name for c in self.containers.values()):
            raise EngineOperationFailed(
                f"cannot create container {spec.name} from {spec.image}: the name is in use",
                why="the container engine refused the request",
                fix="Remove the other container or choose another name.",
            )
        image_id = self.image_id(spec.image)
        container_id = f"mem{next(self._ids):08d}"
        self.containers[container_id] = FakeContainer(spec, self.behave(spec), image_id=image_id)
        return container_id

    def start(self, container_id: str) -> None:
        self._call("start", container_id)
        container = self._get(container_id, "start")
        if container.status is ContainerStatus.PAUSED:
            self._refuse(container, "start", container_id)
        container.status, container.started = ContainerStatus.RUNNING, True

    def stop(self, container_id: str, timeout: int) -> None:
        self._call("stop", container_id)
        container = self._get(container_id, "stop")
        if container.status in (ContainerStatus.RUNNING, ContainerStatus.PAUSED):
            container.status, container.exit_code = ContainerStatus.EXITED, 137

    def kill(self, container_id: str) -> None:
        self._call("kill", container_id)
        container = self._get(container_id, "kill")
        if container.status not in (ContainerStatus.RUNNING, ContainerStatus.PAUSED):
            self._refuse(container, "kill", container_id)
        container.status, container.exit_code = ContainerStatus.EXITED, 137

    def remove(self, container_id: str) -> None:
        self._call("remove", container_id)
        self._get(container_id, "remove")
        del self.containers[container_id]

    def inspect(self, container_id: str) -> ContainerState:
        container = self.containers.get(container_id)
        if container is None:
            return ContainerState(container_id, ContainerStatus.MISSING)
        return ContainerState(
            container_id,
            container.status,
            0 if container.exit_code is None else container.exit_code,  # as engines say
            oom_killed=container.behaviour.oom and container.status is ContainerStatus.EXITED,
            labels=dict(container.spec.labels),
            image_id=container.image_id,
        )

    def image_id(self, ref: str) -> str:
        try:
            return self.images[ref]
        except KeyError:
            raise ImageNotFound(f"cannot inspect image {ref}: image not found") from None

    def pause(self, container_id: str) -> None:
        container = self._get(container_id, "pause")
        if container.status is not ContainerStatus.RUNNING:
            self._refuse(container, "pause", container_id)
        container.status = ContainerStatus.PAUSED

    def resume(self, container_id: str) -> None:
        container = self._get(container_id, "resume")
        if container.status is not ContainerStatus.PAUSED:
            self._refuse(container, "resume", container_id)
        container.status = ContainerStatus.RUNNING

    def wait(self, container_id: str, timeout: float) -> int:
        self._call("wait", container_id)
        container = self._get(container_id, "wait for")
        if container.status is ContainerStatus.EXITED and container.exit_code is not None:
            return container.exit_code
        if container.behaviour.seconds > timeout:
            raise EngineTimeout(f"container {container_id} still running after {timeout} s")
        container.status = ContainerStatus.EXITED
        container.exit_code = 137 if container.behaviour.oom else container.behaviour.exit_code
        return container.exit_code

    def run(self, container_id: str, command: list[str], timeout: float) -> ExecResult:
        container = self._get(container_id, "exec in")
        if container.status is not ContainerStatus.RUNNING:
            self._refuse(container, "exec in", container_id)
        return self.execute(container, command)

    def logs(self, container_id: str, *, follow: bool = False) -> Iterator[str]:
        out, err = self.output(container_id)
        yield out + err

    def output(self, container_id: str) -> tuple[str, str]:
        container = self._get(container_id, "read logs of")
        if not container.started:
            return "", ""
        return container.behaviour.stdout, container.behaviour.stderr

    def create_volume(self, name: str, labels: dict[str, str]) -> str:
        self.volumes[name] = dict(labels)
        return name

    def remove_volume(self, name: str) -> None:
        self._call("remove_volume", name)
        if self.volumes.pop(name, None) is None:
            raise EngineNotFound(f"cannot remove volume {name}: not found (no such volume)")

    def list_containers(self, labels: dict[str, str]) -> list[ContainerState]:
        return [
            self.inspect(cid)
            for cid, c in self.containers.items()
            if all(c.spec.labels.get(k) == v for k, v in labels.items())
        ]

    def list_volumes(self, labels: dict[str, str]) -> dict[str, dict[str, str]]:
        return {
            name: dict(have)
            for name, have in self.volumes.items()
            if all(have.get(k) == v for k, v in labels.items())
        }
