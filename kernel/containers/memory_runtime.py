"""An in-memory ``ContainerRuntime`` for unit tests of the container manager.

Nothing runs: each created container gets a :class:`Behaviour` from a callback (exit
code, output, how long it "runs", OOM), and any method can be made to fail once or
always.  Integration tests use the real engines; this only makes the manager's logic
fast to test.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fluffy.errors import EngineNotFound, EngineTimeout, FluffyError
from fluffy.kernel.containers.runtime import (
    ContainerSpec,
    ContainerState,
    ContainerStatus,
    ExecResult,
    check_mounts,
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


@dataclass
class MemoryRuntime:
    behave: Callable[[ContainerSpec], Behaviour] = lambda _spec: Behaviour()
    failures: dict[str, FluffyError] = field(default_factory=dict)
    containers: dict[str, FakeContainer] = field(default_factory=dict)
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    #: image reference -> its id (a test "rebuilds" an image by changing it)
    images: dict[str, str] = field(default_factory=dict)
    name: str = "memory"
    reports_oom: bool = True
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def _call(self, method: str, target: str) -> None:
        self.calls.append((method, target))
        if method in self.failures:
            raise self.failures[method]

    def _get(self, container_id: str) -> FakeContainer:
        try:
            return self.containers[container_id]
        except KeyError:
            raise EngineNotFound(f"no container {container_id}") from None

    def ping(self) -> bool:
        return True

    def create(self, spec: ContainerSpec) -> str:
        self._call("create", spec.name)
        check_mounts(spec.mounts)
        container_id = f"mem{next(self._ids):08d}"
        container = FakeContainer(spec, self.behave(spec), image_id=self.image_id(spec.image))
        self.containers[container_id] = container
        return container_id

    def start(self, container_id: str) -> None:
        self._call("start", container_id)
        self._get(container_id).status = ContainerStatus.RUNNING

    def stop(self, container_id: str, timeout: int) -> None:
        self._call("stop", container_id)
        self.kill(container_id)

    def kill(self, container_id: str) -> None:
        self._call("kill", container_id)
        container = self._get(container_id)
        container.status, container.exit_code = ContainerStatus.EXITED, 137

    def remove(self, container_id: str) -> None:
        self._call("remove", container_id)
        self._get(container_id)
        del self.containers[container_id]

    def inspect(self, container_id: str) -> ContainerState:
        container = self.containers.get(container_id)
        if container is None:
            return ContainerState(container_id, ContainerStatus.MISSING)
        return ContainerState(
            container_id,
            container.status,
            container.exit_code,
            oom_killed=container.behaviour.oom and container.status is ContainerStatus.EXITED,
            labels=dict(container.spec.labels),
            image_id=container.image_id,
        )

    def image_id(self, ref: str) -> str:
        return self.images.setdefault(ref, f"sha256:{len(self.images):064x}")

    def pause(self, container_id: str) -> None:
        self._get(container_id).status = ContainerStatus.PAUSED

    def resume(self, container_id: str) -> None:
        self._get(container_id).status = ContainerStatus.RUNNING

    def wait(self, container_id: str, timeout: float) -> int:
        self._call("wait", container_id)
        container = self._get(container_id)
        if container.behaviour.seconds > timeout:
            raise EngineTimeout(f"container {container_id} still running after {timeout} s")
        container.status = ContainerStatus.EXITED
        container.exit_code = 137 if container.behaviour.oom else container.behaviour.exit_code
        return container.exit_code

    def run(self, container_id: str, command: list[str], timeout: float) -> ExecResult:
        self._get(container_id)
        return ExecResult(0, "", "")

    def logs(self, container_id: str, *, follow: bool = False) -> Iterator[str]:
        yield self._get(container_id).behaviour.stdout

    def output(self, container_id: str) -> tuple[str, str]:
        behaviour = self._get(container_id).behaviour
        return behaviour.stdout, behaviour.stderr

    def create_volume(self, name: str, labels: dict[str, str]) -> str:
        self.volumes[name] = dict(labels)
        return name

    def remove_volume(self, name: str) -> None:
        self._call("remove_volume", name)
        self.volumes.pop(name, None)

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
