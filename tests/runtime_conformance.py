"""The bar every ``ContainerRuntime`` meets: Docker, Podman, the in-memory one, and any
later one (a Kubernetes runtime: docs/scaling.md).

:class:`RuntimeConformance` holds the tests; a test module subclasses it as ``Test...``
and gives a ``harness`` fixture (tests/unit/kernel/containers/test_runtime_conformance.py:
the in-memory runtime; tests/integration/test_runtime_conformance.py: Docker and Podman).  The
commands the tests run are :data:`SCRIPTS`: real engines run them, the in-memory
runtime plays their documented outcome.  What the suite pins is what the container
manager relies on: states and their transitions, exit codes and output, labels, image
ids, the hardening refusals, and the error class and code of every failure
(fluffy/errors.py: engine.not_found, engine.image_not_found, engine.operation_failed,
engine.timeout, sandbox.config_invalid).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from fluffy.errors import (
    EngineNotFound,
    EngineOperationFailed,
    EngineTimeout,
    FluffyError,
    ImageNotFound,
    SandboxConfigError,
)
from fluffy.kernel.containers.runtime import (
    LABEL_MANAGED,
    LABEL_PURPOSE,
    ContainerRuntime,
    ContainerSpec,
    ContainerStatus,
    Mount,
)
from fluffy.seccomp.compile import oci_json

#: An image reference no runtime has.
MISSING_IMAGE = "fluffy/conformance-missing:000000000000"


@dataclass(frozen=True)
class Script:
    """A command and what running it does (the in-memory runtime plays this)."""

    command: tuple[str, ...]
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    #: how long it runs unless stopped (0: ends at once)
    seconds: float = 0.0


EXITS_3 = Script(("sh", "-c", "echo out; echo err >&2; exit 3"), 3, "out\n", "err\n")
SLEEPS = Script(("sleep", "30"), seconds=30)
#: run inside a running container (an exec)
EXEC_4 = Script(("sh", "-c", "echo o; echo e >&2; exit 4"), 4, "o\n", "e\n")
SCRIPTS = {s.command: s for s in (EXITS_3, SLEEPS, EXEC_4)}


@dataclass
class Harness:
    """A runtime under test, an image it has, and the clean-up of what a test made."""

    runtime: ContainerRuntime
    image: str
    seccomp_dir: Path
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL_MANAGED: "1", LABEL_PURPOSE: f"conformance-{self.run_id}"}

    def spec(self, script: Script, **changes: object) -> ContainerSpec:
        profile = self.seccomp_dir / "standard.json"
        if not profile.exists():
            profile.write_text(oci_json("standard"))
        spec = ContainerSpec(
            name=f"fluffy-conformance-{uuid.uuid4().hex[:12]}",
            image=self.image,
            command=list(script.command),
            labels=self.labels,
            memory_bytes=64 * 2**20,
            nano_cpus=500_000_000,
            pids_limit=16,
            seccomp_json=oci_json("standard"),
            seccomp_path=profile,
        )
        return msgspec.structs.replace(spec, **changes)  # type: ignore[arg-type]

    def create(self, script: Script, **changes: object) -> str:
        container_id = self.runtime.create(self.spec(script, **changes))
        self.containers.append(container_id)
        return container_id

    def started(self, script: Script) -> str:
        container_id = self.create(script)
        self.runtime.start(container_id)
        return container_id

    def clean(self) -> None:
        for container_id in self.containers:
            with contextlib.suppress(FluffyError):
                self.runtime.remove(container_id)
        for name in self.volumes:
            with contextlib.suppress(FluffyError):
                self.runtime.remove_volume(name)


def refused(error: type[FluffyError], code: str, call: Callable[[], object]) -> FluffyError:
    """``call`` raises exactly the fluffy error ``error`` with ``code``."""
    with pytest.raises(error) as info:
        call()
    assert info.value.code == code, info.value
    assert info.value.what and info.value.fix  # says what happened and how to fix it
    return info.value


class RuntimeConformance:
    """Subclass as ``TestXRuntime`` with a ``harness`` fixture yielding a :class:`Harness`."""

    def test_is_a_container_runtime_that_answers(self, harness: Harness) -> None:
        runtime = harness.runtime
        assert isinstance(runtime, ContainerRuntime)
        assert runtime.name and isinstance(runtime.reports_oom, bool)
        assert runtime.ping() is True

    def test_a_container_runs_once_started_and_keeps_its_exit_code_and_output(
        self, harness: Harness
    ) -> None:
        runtime = harness.runtime
        container_id = harness.create(EXITS_3)
        created = runtime.inspect(container_id)
        assert (created.status, created.exit_code) == (ContainerStatus.CREATED, 0)
        assert harness.labels.items() <= created.labels.items()  # engines add the image's
        assert created.image_id == runtime.image_id(harness.image)
        assert created.image_id.startswith("sha256:")
        assert runtime.output(container_id) == ("", "")  # nothing ran yet
        assert "".join(runtime.logs(container_id)) == ""
        runtime.start(container_id)
        assert runtime.wait(container_id, 60) == 3
        exited = runtime.inspect(container_id)
        assert (exited.status, exited.exit_code, exited.oom_killed) == (
            ContainerStatus.EXITED,
            3,
            False,
        )
        assert runtime.output(container_id) == (EXITS_3.stdout, EXITS_3.stderr)
        logs = "".join(runtime.logs(container_id))
        assert "out" in logs and "err" in logs  # logs: both streams
        assert runtime.wait(container_id, 60) == 3  # waiting again: the same code

    def test_a_running_container_pauses_resumes_execs_and_is_killed(self, harness: Harness) -> None:
        runtime = harness.runtime
        container_id = harness.started(SLEEPS)
        assert runtime.inspect(container_id).status is ContainerStatus.RUNNING
        runtime.start(container_id)  # starting a running container: nothing happens
        refused(EngineTimeout, "engine.timeout", lambda: runtime.wait(container_id, 0.5))
        refused(
            EngineOperationFailed, "engine.operation_failed", lambda: runtime.resume(container_id)
        )
        runtime.pause(container_id)
        assert runtime.inspect(container_id).status is ContainerStatus.PAUSED
        refused(
            EngineOperationFailed, "engine.operation_failed", lambda: runtime.pause(container_id)
        )
        refused(
            EngineOperationFailed,
            "engine.operation_failed",
            lambda: runtime.run(container_id, list(EXEC_4.command), 30),
        )
        runtime.resume(container_id)
        assert runtime.inspect(container_id).status is ContainerStatus.RUNNING
        result = runtime.run(container_id, list(EXEC_4.command), 30)
        assert (result.exit_code, result.stdout, result.stderr) == (
            EXEC_4.exit_code,
            EXEC_4.stdout,
            EXEC_4.stderr,
        )
        runtime.kill(container_id)
        killed = runtime.inspect(container_id)
        assert (killed.status, killed.exit_code) == (ContainerStatus.EXITED, 137)
        assert runtime.wait(container_id, 30) == 137
        refused(
            EngineOperationFailed, "engine.operation_failed", lambda: runtime.kill(container_id)
        )

    def test_stop_ends_a_running_container_and_leaves_others_alone(self, harness: Harness) -> None:
        runtime = harness.runtime
        created = harness.create(SLEEPS)
        runtime.stop(created, 1)  # never started: still just created
        assert runtime.inspect(created).status is ContainerStatus.CREATED
        running = harness.started(SLEEPS)
        runtime.stop(running, 1)  # sleep ignores SIGTERM as pid 1: killed after 1 s
        stopped = runtime.inspect(running)
        assert (stopped.status, stopped.exit_code) == (ContainerStatus.EXITED, 137)

    def test_what_needs_a_running_container_refuses_a_created_one(self, harness: Harness) -> None:
        runtime = harness.runtime
        container_id = harness.create(SLEEPS)
        for call in (
            lambda: runtime.run(container_id, list(EXEC_4.command), 30),
            lambda: runtime.pause(container_id),
            lambda: runtime.kill(container_id),
        ):
            refused(EngineOperationFailed, "engine.operation_failed", call)
        assert runtime.inspect(container_id).status is ContainerStatus.CREATED

    def test_a_removed_container_is_missing_to_every_operation(self, harness: Harness) -> None:
        runtime = harness.runtime
        container_id = harness.create(EXITS_3)
        runtime.remove(container_id)
        gone = runtime.inspect(container_id)
        assert (gone.status, gone.exit_code, gone.labels) == (ContainerStatus.MISSING, None, {})
        calls: list[Callable[[], object]] = [
            lambda: runtime.remove(container_id),  # a second remove is not silent
            lambda: runtime.start(container_id),
            lambda: runtime.stop(container_id, 1),
            lambda: runtime.kill(container_id),
            lambda: runtime.pause(container_id),
            lambda: runtime.resume(container_id),
            lambda: runtime.wait(container_id, 1),
            lambda: runtime.run(container_id, ["true"], 1),
            lambda: "".join(runtime.logs(container_id)),
            lambda: runtime.output(container_id),
        ]
        for call in calls:
            refused(EngineNotFound, "engine.not_found", call)

    def test_a_running_container_is_removed_by_force(self, harness: Harness) -> None:
        runtime = harness.runtime
        container_id = harness.started(SLEEPS)
        runtime.remove(container_id)
        assert runtime.inspect(container_id).status is ContainerStatus.MISSING

    def test_container_names_are_unique(self, harness: Harness) -> None:
        spec = harness.spec(EXITS_3, name="fluffy-conformance-twice-" + harness.run_id)
        harness.containers.append(harness.runtime.create(spec))
        refused(
            EngineOperationFailed, "engine.operation_failed", lambda: harness.runtime.create(spec)
        )

    def test_a_missing_image_is_image_not_found(self, harness: Harness) -> None:
        runtime = harness.runtime
        refused(ImageNotFound, "engine.image_not_found", lambda: runtime.image_id(MISSING_IMAGE))
        refused(
            ImageNotFound,
            "engine.image_not_found",
            lambda: harness.create(EXITS_3, image=MISSING_IMAGE),
        )

    def test_containers_are_listed_by_label(self, harness: Harness) -> None:
        runtime = harness.runtime
        mine = harness.create(EXITS_3, labels={**harness.labels, "org.fluffy.session": "a"})
        other = harness.create(EXITS_3, labels={**harness.labels, "org.fluffy.session": "b"})
        listed = runtime.list_containers({**harness.labels, "org.fluffy.session": "a"})
        assert [s.id for s in listed] == [mine]
        assert listed[0].status is ContainerStatus.CREATED
        assert listed[0].labels["org.fluffy.session"] == "a"
        both = {s.id for s in runtime.list_containers(harness.labels)}
        assert both == {mine, other}

    def test_volumes_carry_labels_and_a_second_remove_is_not_silent(self, harness: Harness) -> None:
        runtime = harness.runtime
        name = f"fluffy-conformance-{harness.run_id}"
        harness.volumes.append(name)
        assert runtime.create_volume(name, harness.labels) == name
        assert runtime.list_volumes(harness.labels) == {name: harness.labels}
        runtime.remove_volume(name)
        assert runtime.list_volumes(harness.labels) == {}
        refused(EngineNotFound, "engine.not_found", lambda: runtime.remove_volume(name))

    @pytest.mark.parametrize(
        "change",
        [
            {"seccomp_json": "", "seccomp_path": None},
            {"user": "0:0"},
            {"user": "root"},
            {"mounts": (Mount(Path("/var/run"), "/engine"),)},
            {"mounts": (Mount(Path("/tmp"), "/proc"),)},
        ],
        ids=["no-seccomp", "uid-0", "root", "engine-socket-folder", "proc-target"],
    )
    def test_the_hardening_refusals_hold(self, harness: Harness, change: dict[str, object]) -> None:
        refused(
            SandboxConfigError,
            "sandbox.config_invalid",
            lambda: harness.create(EXITS_3, **change),
        )
        assert harness.runtime.list_containers(harness.labels) == []


def harness_for(runtime: ContainerRuntime, image: str, seccomp_dir: Path) -> Iterator[Harness]:
    """The ``harness`` fixture's body: a harness, cleaned up after the test."""
    harness = Harness(runtime, image, seccomp_dir)
    try:
        yield harness
    finally:
        harness.clean()
