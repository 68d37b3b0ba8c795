"""The container manager's logic on the in-memory runtime (the real engines: integration)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fluffy.errors import EngineOperationFailed, SandboxConfigError, SandboxStateError
from fluffy.kernel.containers.config import TEMPLATES, template_config
from fluffy.kernel.containers.lifecycle import FailureReason, Sandbox, SandboxState
from fluffy.kernel.containers.manager import ContainerManager
from fluffy.kernel.containers.memory_runtime import Behaviour, MemoryRuntime
from fluffy.kernel.containers.runtime import (
    LABEL_MANAGED,
    LABEL_ROOT,
    LABEL_SANDBOX,
    LABEL_SESSION,
    LABEL_TEMPLATE,
    ContainerSpec,
    Mount,
    check_mounts,
    check_user,
    root_label,
    sandbox_identity,
)

IMAGES = {t: f"fluffy/test:{t}" for t in TEMPLATES}


def _runtime() -> MemoryRuntime:
    runtime = MemoryRuntime()
    for ref in IMAGES.values():
        runtime.add_image(ref)
    return runtime


@pytest.fixture()
def runtime() -> MemoryRuntime:
    return _runtime()


@pytest.fixture()
def manager(runtime: MemoryRuntime, tmp_path: Path) -> ContainerManager:
    return ContainerManager(runtime, IMAGES, session_id="s1", root=tmp_path / "state")


def _states(sandbox: Sandbox) -> list[str]:
    return [str(state) for state, _ in sandbox.history]


def test_normal_run_walks_the_design_lifecycle(
    manager: ContainerManager, runtime: MemoryRuntime
) -> None:
    runtime.behave = lambda spec: Behaviour(exit_code=0, stdout="hello\n")
    outcome = manager.run(template_config("code-executor"), ["echo", "hello"])
    assert outcome.exit_code == 0 and outcome.stdout == "hello\n"
    assert _states(outcome.sandbox) == ["creating", "running", "stopping", "cleanup", "destroyed"]
    assert runtime.containers == {} and not outcome.sandbox.output_dir.exists()
    assert manager.active == {}


def test_a_failing_command_is_a_normal_exit(
    manager: ContainerManager, runtime: MemoryRuntime
) -> None:
    runtime.behave = lambda spec: Behaviour(exit_code=1)
    outcome = manager.run(template_config("code-executor"), ["pytest"])
    assert outcome.exit_code == 1 and outcome.failure is None


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        (Behaviour(seconds=999), FailureReason.TIMEOUT),
        (Behaviour(oom=True), FailureReason.OOM),
        (Behaviour(exit_code=139), FailureReason.CRASH),
    ],
)
def test_abnormal_exits_fail_and_are_cleaned(
    manager: ContainerManager, runtime: MemoryRuntime, behaviour: Behaviour, reason: FailureReason
) -> None:
    runtime.behave = lambda spec: behaviour
    outcome = manager.run(template_config("code-executor", max_duration="2s"), ["x"])
    assert outcome.failure is reason
    assert _states(outcome.sandbox) == ["creating", "running", "failed", "cleanup", "destroyed"]
    assert runtime.containers == {}


def test_unexplained_sigkill_is_oom_where_the_engine_cannot_say(
    manager: ContainerManager, runtime: MemoryRuntime
) -> None:
    runtime.reports_oom = False  # as Podman 4.3 on hybrid cgroups
    runtime.behave = lambda spec: Behaviour(exit_code=137)
    assert manager.run(template_config("code-executor"), ["x"]).failure is FailureReason.OOM
    runtime.reports_oom = True
    assert manager.run(template_config("code-executor"), ["x"]).failure is FailureReason.CRASH


def test_timeout_kills_before_removing(manager: ContainerManager, runtime: MemoryRuntime) -> None:
    runtime.behave = lambda spec: Behaviour(seconds=10)
    manager.run(template_config("code-executor", max_duration="1s"), ["sleep", "10"])
    methods = [m for m, _ in runtime.calls]
    assert methods.index("kill") < methods.index("remove")


def test_create_failure_is_failed_cleaned_and_raised_with_context(
    manager: ContainerManager, runtime: MemoryRuntime
) -> None:
    runtime.failures["create"] = EngineOperationFailed("no space left")
    with pytest.raises(EngineOperationFailed) as info:
        manager.create(template_config("code-executor"), ["true"])
    assert "cannot create sandbox fluffy-code-executor-" in info.value.what
    assert manager.active == {}
    assert list((manager.root / "outputs" / "s1").iterdir()) == []


def test_unwritable_state_folder_is_a_clear_error(runtime: MemoryRuntime, tmp_path: Path) -> None:
    manager = ContainerManager(runtime, IMAGES, session_id="s9", root=tmp_path)
    (tmp_path / "outputs").rmdir()
    (tmp_path / "outputs").write_text("a file where the folder should be")
    with pytest.raises(SandboxConfigError) as info:
        manager.create(template_config("code-executor"), ["true"])
    assert "output folder" in info.value.what and manager.active == {}


def test_start_failure_removes_the_created_container(
    manager: ContainerManager, runtime: MemoryRuntime
) -> None:
    runtime.failures["start"] = EngineOperationFailed("OCI runtime error")
    with pytest.raises(EngineOperationFailed):
        manager.create(template_config("code-executor"), ["true"])
    assert runtime.containers == {}
    assert [m for m, _ in runtime.calls].count("create") == 2  # one retry, then the error


def test_a_transient_start_failure_is_retried_once(
    manager: ContainerManager, runtime: MemoryRuntime
) -> None:
    class Once(MemoryRuntime):
        failed = False

        def start(self, container_id: str) -> None:
            if not self.failed:
                self.failed = True
                raise EngineOperationFailed("runc start failed: exit status 1")
            super().start(container_id)

    flaky = Once(images=dict(runtime.images))
    retrying = ContainerManager(flaky, IMAGES, session_id="r1", root=manager.root)
    sandbox = retrying.create(template_config("code-executor"), ["true"])
    assert sandbox.state is SandboxState.RUNNING and len(flaky.containers) == 1
    retrying.close()


def test_cleanup_steps_are_independent_and_idempotent(
    manager: ContainerManager, runtime: MemoryRuntime
) -> None:
    sandbox = manager.create(template_config("code-executor"), ["true"])
    runtime.failures["remove"] = EngineOperationFailed("engine hiccup")
    manager.destroy(sandbox)
    assert sandbox.state is SandboxState.DESTROYED
    assert any(e.startswith("remove container") for e in sandbox.cleanup_errors)
    assert not sandbox.output_dir.exists()  # the next step still ran
    manager.destroy(sandbox)  # again: nothing happens, nothing raised
    assert sandbox.state is SandboxState.DESTROYED


def test_the_spec_carries_limits_labels_mounts_and_the_profile(
    manager: ContainerManager, runtime: MemoryRuntime, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    config = template_config("ai-provider", project_dir=project)
    sandbox = manager.create(config, ["python3"])
    spec: ContainerSpec = runtime.containers[sandbox.container_id or ""].spec
    assert spec.memory_bytes == 256 * 2**20 and spec.nano_cpus == 500_000_000
    assert spec.pids_limit == 10 and spec.seccomp_profile == "strict"
    assert json.loads(spec.seccomp_json)["defaultErrnoRet"] == 1
    assert spec.labels == {
        LABEL_MANAGED: "1",
        LABEL_ROOT: root_label(manager.root),
        LABEL_SESSION: "s1",
        LABEL_SANDBOX: sandbox.sandbox_id,
        LABEL_TEMPLATE: "ai-provider",
    }
    assert spec.mounts == (Mount(project.resolve(), "/workspace", True),)
    assert spec.image == IMAGES["ai-provider"] and spec.tmpfs["/tmp"].startswith("rw,noexec")
    assert spec.tmpfs["/output"].startswith("rw,noexec")  # its own, not the kernel's folder
    manager.destroy(sandbox)


def test_hardening_is_constant() -> None:
    from fluffy.kernel.containers.hardening import harden

    spec = ContainerSpec(name="x", image="i", command=["true"], labels={}, seccomp_json="{}")
    hardening = harden(spec, seccomp="json")
    assert hardening.read_only_rootfs and hardening.no_new_privileges
    assert hardening.cap_drop == ("ALL",) and hardening.cap_add == ()
    assert hardening.network_mode == "none"


def test_sandboxes_run_as_the_kernel_user_never_root(
    manager: ContainerManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-root kernel's sandboxes share its uid (they read what the project's owner
    can); a root kernel's run as 10001; uid 0 is refused by every runtime."""
    sandbox = manager.create(template_config("code-executor"), ["true"])
    spec = manager.runtime.containers[sandbox.container_id].spec  # type: ignore[attr-defined]
    expected = "10001:10001" if os.geteuid() == 0 else f"{os.geteuid()}:{os.getegid()}"
    assert spec.user == expected
    manager.destroy(sandbox)
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    monkeypatch.setattr(os, "getegid", lambda: 1234)
    assert sandbox_identity() == (1234, 1234)
    for bad in ("0", "0:0", "root", "", "fluffy"):
        with pytest.raises(SandboxConfigError, match="refusing to run a sandbox as"):
            check_user(bad)


@pytest.mark.parametrize("source", ["/var/run/docker.sock", "/run/podman", "/", "/etc", "/proc/1"])
def test_engine_sockets_and_system_folders_are_never_mounted(source: str) -> None:
    with pytest.raises(SandboxConfigError):
        check_mounts((Mount(Path(source), "/x"),))


def test_a_socket_file_is_never_mounted(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "engine.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(SandboxConfigError):
            check_mounts((Mount(path, "/x"),))


def test_missing_project_and_missing_image_are_config_errors(
    runtime: MemoryRuntime, tmp_path: Path
) -> None:
    manager = ContainerManager(runtime, {}, session_id="s2", root=tmp_path)
    with pytest.raises(SandboxConfigError):
        manager.create(template_config("code-executor"), ["true"])
    full = ContainerManager(runtime, IMAGES, session_id="s3", root=tmp_path)
    with pytest.raises(SandboxConfigError):
        full.create(template_config("code-executor", project_dir=tmp_path / "nope"), ["true"])


def test_lifecycle_refuses_illegal_transitions() -> None:
    sandbox = Sandbox("id", "code-executor", "n", Path("/nonexistent"))
    with pytest.raises(SandboxStateError):
        sandbox.move(SandboxState.DESTROYED)


def test_templates_have_the_design_limits() -> None:
    want = {
        "ai-provider": ("256MiB", 0.5, 10, "120s", "strict"),
        "code-executor": ("1GiB", 1.0, 100, "300s", "standard"),
        "policy-sandbox": ("128MiB", 0.25, 5, "100ms", "strict"),
        "integration-test": ("1GiB", 1.0, 100, "300s", "standard-net"),
        "mcp-server": ("512MiB", 1.0, 64, "24h", "standard"),  # long-lived (ADR-046)
    }
    got = {
        n: (c.memory_limit, c.cpu_limit, c.max_pids, c.max_duration, c.seccomp_profile)
        for n, c in TEMPLATES.items()
    }
    assert got == want


def test_garbage_of_a_dead_session_is_removed_and_live_ones_kept(
    runtime: MemoryRuntime, tmp_path: Path
) -> None:
    root = tmp_path / "state"
    crashed = ContainerManager(runtime, IMAGES, session_id="dead", root=root)
    orphan = crashed.create(template_config("code-executor"), ["sleep", "1"])
    ours = {LABEL_MANAGED: "1", LABEL_ROOT: crashed.root_label}
    runtime.create_volume("fluffy-dead-vol", {**ours, LABEL_SESSION: "dead"})
    runtime.create_volume("fluffy-live-vol", {**ours, LABEL_SESSION: "live"})
    (root / "sessions" / "dead").write_text("999999999")  # a pid that cannot exist
    # A running kernel's sandbox under its own state folder: this folder has no session
    # file for it, which says nothing about whether it runs (it does).
    kernel = ContainerManager(runtime, IMAGES, session_id="k1", root=tmp_path / "kernel")
    running = kernel.create(template_config("code-executor"), ["sleep", "1"])
    (tmp_path / "kernel" / "sessions" / "k1").unlink()  # nor does a missing file there
    current = ContainerManager(runtime, IMAGES, session_id="live", root=root)
    mine = current.create(template_config("code-executor"), ["sleep", "1"])
    assert crashed.root_label == current.root_label != kernel.root_label  # one id per folder
    report = current.collect_garbage()
    assert report.containers == [orphan.container_id]
    assert report.volumes == ["fluffy-dead-vol"]
    assert report.output_dirs == [str(root / "outputs" / "dead")]
    assert set(runtime.containers) == {mine.container_id, running.container_id}
    assert not (root / "sessions" / "dead").exists()
    current.close()
    assert set(runtime.containers) == {running.container_id}
    assert not (root / "sessions" / "live").exists()


def test_strays_of_the_same_labels_are_removed_others_kept(
    runtime: MemoryRuntime, tmp_path: Path
) -> None:
    project = {"org.fluffy.project": "p1"}
    killed = ContainerManager(runtime, IMAGES, session_id="k1", root=tmp_path, labels=project)
    stray = killed.create(template_config("code-executor"), ["sleep", "1"])
    other = ContainerManager(
        runtime, IMAGES, session_id="k9", root=tmp_path, labels={"org.fluffy.project": "p2"}
    ).create(template_config("code-executor"), ["sleep", "1"])
    kernel = ContainerManager(runtime, IMAGES, session_id="k2", root=tmp_path, labels=project)
    mine = kernel.create(template_config("code-executor"), ["sleep", "1"])
    report = kernel.remove_strays()
    assert report.containers == [stray.container_id] and not report.errors
    assert set(runtime.containers) == {mine.container_id, other.container_id}


def test_output_is_the_sandboxs_own_tmpfs_and_its_folder_the_kernels(
    manager: ContainerManager,
) -> None:
    sandbox = manager.create(template_config("code-executor"), ["true"])
    spec = manager.runtime.containers[sandbox.container_id].spec  # type: ignore[attr-defined]
    assert "/output" not in [m.target for m in spec.mounts]  # nothing shared with the kernel
    options = spec.tmpfs["/output"].split(",")
    assert {"noexec", "nosuid", "nodev", "size=256m"} <= set(options)
    info = sandbox.output_dir.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (os.geteuid(), 0o700)
    manager.destroy(sandbox)


@pytest.mark.parametrize("size", ["0", "0MiB", "0.5", "5MiB"])
def test_memory_limits_that_would_mean_unlimited_are_refused(size: str) -> None:
    from fluffy.errors import ConfigError

    with pytest.raises(ConfigError):
        template_config("code-executor", memory_limit=size)


def test_runtimes_refuse_a_container_without_a_seccomp_profile() -> None:
    import docker

    from fluffy.kernel.containers.docker_runtime import DockerRuntime

    client = docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.41")
    spec = ContainerSpec(name="x", image="i", command=["true"], labels={})
    with pytest.raises(SandboxConfigError) as info:
        DockerRuntime(client).host_config(spec)
    assert "no seccomp profile" in info.value.what
    client.close()


def test_an_unexpected_exception_still_cleans_up(runtime: MemoryRuntime, tmp_path: Path) -> None:
    manager = ContainerManager(runtime, IMAGES, session_id="s7", root=tmp_path)

    def explode(spec: ContainerSpec) -> Behaviour:
        raise ValueError("bug in a runtime")

    runtime.behave = explode
    with pytest.raises(ValueError):
        manager.create(template_config("code-executor"), ["true"])
    assert manager.active == {}
    assert list((tmp_path / "outputs" / "s7").iterdir()) == []
    manager.close()


def test_state_folders_are_private(manager: ContainerManager) -> None:
    for folder in (manager.root, manager.root / "sessions", manager.root / "outputs"):
        assert folder.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(("field", "value"), [("memory_limit", "1gb"), ("max_duration", "10")])
def test_bad_units_in_a_sandbox_config_name_the_field(field: str, value: str) -> None:
    from fluffy.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        template_config("code-executor", **{field: value})
    assert field in str(info.value) and value in str(info.value)


def _observed(manager: ContainerManager) -> list[tuple[str, str, dict[str, str]]]:
    seen: list[tuple[str, str, dict[str, str]]] = []
    manager.observer = lambda kind, sandbox, details: seen.append(
        (kind, sandbox.sandbox_id, details)
    )
    return seen


def test_each_sandbox_is_told_created_then_destroyed_with_its_call(
    manager: ContainerManager, runtime: MemoryRuntime
) -> None:
    seen = _observed(manager)
    sandbox = manager.create(template_config("code-executor"), ["true"], call_id="c-42")
    manager.destroy(sandbox)
    assert [(kind, sid) for kind, sid, _ in seen] == [
        ("created", sandbox.sandbox_id),
        ("destroyed", sandbox.sandbox_id),
    ]
    created, destroyed = seen[0][2], seen[1][2]
    assert created["template"] == "code-executor" and created["seccomp_profile"] == "standard"
    assert created["image"] == IMAGES["code-executor"] and created["call_id"] == "c-42"
    assert created["memory_limit"] == "1GiB" and created["max_pids"] == "100"
    assert destroyed["call_id"] == "c-42" and destroyed["failure"] == ""
    assert float(destroyed["lived_ms"]) >= 0


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        (Behaviour(seconds=10), "timeout"),
        (Behaviour(oom=True), "oom"),
        (Behaviour(exit_code=139), "crash"),
    ],
)
def test_a_failing_sandbox_is_told_failed_once_then_destroyed(
    manager: ContainerManager, runtime: MemoryRuntime, behaviour: Behaviour, reason: str
) -> None:
    runtime.behave = lambda spec: behaviour
    seen = _observed(manager)
    manager.run(template_config("code-executor", max_duration="1s"), ["x"])
    assert [kind for kind, _, _ in seen] == ["created", "failed", "destroyed"]
    assert seen[1][2]["reason"] == reason and seen[2][2]["failure"] == reason


def test_a_sandbox_the_engine_would_not_start_is_told_failed(
    manager: ContainerManager, runtime: MemoryRuntime
) -> None:
    runtime.failures["start"] = EngineOperationFailed("OCI runtime error")
    seen = _observed(manager)
    with pytest.raises(EngineOperationFailed):
        manager.create(template_config("code-executor"), ["true"])
    kinds = [kind for kind, _, _ in seen]
    assert kinds == ["failed", "destroyed", "failed", "destroyed"]  # the retry too
    assert seen[0][2]["step"] == "start" and "OCI runtime error" in seen[0][2]["error"]


def test_a_broken_observer_never_breaks_the_lifecycle(
    manager: ContainerManager, runtime: MemoryRuntime
) -> None:
    def broken(kind: str, sandbox: Sandbox, details: dict[str, str]) -> None:
        raise RuntimeError("the audit log is gone")

    manager.observer = broken
    outcome = manager.run(template_config("code-executor"), ["true"])
    assert outcome.exit_code == 0 and runtime.containers == {}


def test_seccomp_files_are_written_safely_from_many_threads(tmp_path: Path) -> None:
    """Sandboxes are made from several threads (a call and the warm pool): each writes
    the profile file under a name of its own, so none finds its temporary file renamed
    away by another (a CI run hit exactly that)."""
    import threading

    found: list[Path] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def make() -> None:
        try:
            own = ContainerManager(_runtime(), IMAGES, session_id="t", root=tmp_path)
            start.wait()
            found.append(own._seccomp_file("standard"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(found)) == 1
    assert json.loads(found[0].read_text())["defaultAction"]
    assert [p.name for p in found[0].parent.iterdir()] == [found[0].name]  # no leftovers
