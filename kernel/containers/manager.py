"""The container manager: create, monitor and destroy L2 sandboxes.

It does three things only (design: Container Manager, Responsibilities): create a
sandbox from a :class:`SandboxConfig`, watch it (time limit, OOM, crash), and destroy
it.  Whether a sandbox may be created at all is the policy engine's decision.

Every resource it makes carries the labels of :mod:`runtime` (managed, session, sandbox,
template, root); :meth:`ContainerManager.collect_garbage` removes what a crashed session
of the same state folder left, never another folder's (a running kernel's) sandbox.
CLEANUP runs each step on its own: a failing step is recorded and the next still runs.

Its ``observer`` is told of each sandbox's life (the kernel audits it): ``created``
(template, image, seccomp profile, limits, the call if known), ``failed`` (create or
start refused, time limit, OOM, crash) and ``destroyed`` (exit code, failure, the call
it served, how long it lived).  It is called from the thread that did the work.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import (
    EngineNotFound,
    EngineOperationFailed,
    EngineTimeout,
    FluffyError,
    SandboxConfigError,
)
from fluffy.kernel.confined_files import write_atomic
from fluffy.kernel.containers.config import SandboxConfig
from fluffy.kernel.containers.lifecycle import FailureReason, Sandbox, SandboxState
from fluffy.kernel.containers.runtime import (
    LABEL_MANAGED,
    LABEL_ROOT,
    LABEL_SANDBOX,
    LABEL_SESSION,
    LABEL_TEMPLATE,
    ContainerRuntime,
    ContainerSpec,
    ContainerStatus,
    Mount,
    check_mounts,
    root_label,
    sandbox_user,
)
from fluffy.paths import state_dir
from fluffy.process import pid_alive
from fluffy.seccomp.compile import oci_json

PROJECT_TARGET = "/workspace"
OUTPUT_TARGET = "/output"
#: A call's output: the sandbox's own tmpfs, sent back over its socket (tools.callfiles).
OUTPUT_MAX_BYTES = 256 * 1024 * 1024
#: Scratch space and output: private, not executable, size-capped.
TMPFS = {
    "/tmp": "rw,noexec,nosuid,nodev,size=64m",  # noqa: S108 - inside the sandbox
    OUTPUT_TARGET: f"rw,noexec,nosuid,nodev,size={OUTPUT_MAX_BYTES // 2**20}m,mode=1777",
}
#: Templates that run the project's tests: test code may run what it writes under its temp
#: folders (pytest's tmp_path: a suite's small executables, a pager stub), as on the
#: person's machine.  Every other protection stays: read-only root and project, no
#: network, seccomp, limits, nosuid/nodev; /output stays noexec.
EXEC_TMP_TEMPLATES = frozenset({"code-executor", "integration-test"})
EXEC_TMP = "rw,exec,nosuid,nodev,size=256m"


def tmpfs_for(template: str) -> dict[str, str]:
    """The tmpfs mounts of a ``template`` sandbox."""
    if template in EXEC_TMP_TEMPLATES:
        return {**TMPFS, "/tmp": EXEC_TMP}  # noqa: S108 - inside the sandbox
    return dict(TMPFS)


#: Where a sandbox finds its own kernel socket (a read-only mount of its socket folder).
KERNEL_SOCKET_TARGET = "/run/fluffy"
#: Where tool plugins find the session's staged (not yet merged) changes.
STAGED_TARGET = "/staged"
#: Exit codes above this mean the process died from a signal (128 + n).
_SIGNAL_EXIT = 128
_SIGKILL_EXIT = 128 + 9

#: (kind: created / failed / destroyed, the sandbox, what to record)
Observer = Callable[[str, Sandbox, dict[str, str]], None]


class RunOutcome(msgspec.Struct):
    sandbox: Sandbox
    exit_code: int | None
    stdout: str
    stderr: str

    @property
    def failure(self) -> FailureReason | None:
        return self.sandbox.failure


class GarbageReport(msgspec.Struct):
    containers: list[str] = msgspec.field(default_factory=list)
    volumes: list[str] = msgspec.field(default_factory=list)
    output_dirs: list[str] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)


class ContainerManager:
    """Sandboxes of one session on one runtime."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        images: Mapping[str, str],
        *,
        session_id: str | None = None,
        root: Path | None = None,
        host_path: Callable[[Path], Path] = lambda path: path,
        labels: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> None:
        self.runtime = runtime
        #: "uid:gid" of every sandbox (None: :func:`sandbox_identity`); never root.
        self.user = user
        #: Extra labels on every sandbox (the kernel adds its project's).
        self.labels = dict(labels or {})
        self.images = dict(images)
        self.session_id = session_id or uuid.uuid4().hex[:12]
        self.root = root or state_dir()
        self.host_path = host_path  # kernel path -> path the engine sees (sibling containers)
        self.active: dict[str, Sandbox] = {}
        for private in (self.root, self.root / "sessions", self.root / "outputs"):
            private.mkdir(parents=True, exist_ok=True, mode=0o700)
            private.chmod(0o700)
        #: LABEL_ROOT of every sandbox made here: the sessions this folder's files speak for
        self.root_label = root_label(self.root)
        self._session_file = self.root / "sessions" / self.session_id
        self._session_file.write_text(str(os.getpid()))
        self._seccomp_paths: dict[str, Path] = {}
        self._seccomp_lock = threading.Lock()
        self.observer: Observer | None = None

    def _tell(self, kind: str, sandbox: Sandbox, details: dict[str, Any]) -> None:
        if self.observer is None:
            return
        with contextlib.suppress(Exception):  # an observer never breaks the lifecycle
            self.observer(kind, sandbox, {k: str(v) for k, v in details.items()})

    # -- set-up ---------------------------------------------------------------------
    def _output_dir(self, sandbox_id: str) -> Path:
        """The kernel's own folder for what the sandbox sends back (never mounted: the
        sandbox writes its ``/output`` tmpfs, and its files come over its socket)."""
        path = self.root / "outputs" / self.session_id / sandbox_id
        path.mkdir(parents=True)
        path.chmod(0o700)
        return path

    def _seccomp_file(self, profile: str) -> Path:
        """Podman reads the profile from a file; one per profile content."""
        with self._seccomp_lock:  # sandboxes are made from several threads at once
            if profile not in self._seccomp_paths:
                text = oci_json(profile)
                digest = hashlib.sha256(text.encode()).hexdigest()[:12]
                path = self.root / "seccomp" / f"{profile}-{digest}.json"
                if not path.exists():  # write_atomic: a temporary name of its own
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(path.parent, path.name, text.encode(), mode=0o644)
                self._seccomp_paths[profile] = path
            return self._seccomp_paths[profile]

    def _spec(self, sandbox: Sandbox, config: SandboxConfig, command: list[str]) -> ContainerSpec:
        try:
            image = config.image or self.images[config.template]
        except KeyError:
            raise SandboxConfigError(
                f"no image for the sandbox template {config.template}",
                fix="Run `fluffy images build`.",
            ) from None
        mounts: list[Mount] = []
        if config.project_dir is not None:
            if not config.project_dir.is_dir():
                raise SandboxConfigError(
                    f"project directory {config.project_dir} does not exist",
                    fix="Pass an existing directory with --project.",
                )
            mounts.insert(0, Mount(config.project_dir, PROJECT_TARGET, read_only=True))
        if config.kernel_socket_dir is not None:
            mounts.append(Mount(config.kernel_socket_dir, KERNEL_SOCKET_TARGET, read_only=True))
        if config.staged_dir is not None:
            mounts.append(Mount(config.staged_dir, STAGED_TARGET, read_only=True))
        # Check the kernel's own paths, then translate them for the engine (siblings).
        engine_mounts = tuple(
            Mount(self.host_path(m.source), m.target, m.read_only)
            for m in check_mounts(tuple(mounts))
        )
        podman = self.runtime.name == "podman"
        return ContainerSpec(
            name=sandbox.name,
            image=image,
            command=command,
            labels={
                **self.labels,
                LABEL_MANAGED: "1",
                LABEL_ROOT: self.root_label,
                LABEL_SESSION: self.session_id,
                LABEL_SANDBOX: sandbox.sandbox_id,
                LABEL_TEMPLATE: config.template,
            },
            mounts=engine_mounts,
            workdir=config.workdir if config.project_dir is not None else "/tmp",  # noqa: S108
            environment=dict(config.environment),
            memory_bytes=config.memory_bytes,
            nano_cpus=config.nano_cpus,
            pids_limit=config.max_pids,
            seccomp_profile=config.seccomp_profile,
            seccomp_json="" if podman else oci_json(config.seccomp_profile),
            seccomp_path=self.host_path(self._seccomp_file(config.seccomp_profile))
            if podman
            else None,
            tmpfs=tmpfs_for(config.template),
            user=self.user or sandbox_user(),
        )

    # -- lifecycle ------------------------------------------------------------------
    def create(self, config: SandboxConfig, command: list[str], *, call_id: str = "") -> Sandbox:
        """CREATING -> RUNNING (or FAILED, already cleaned up, with the error raised).

        An engine that refuses to *start* a container it just created (seen with Podman
        4.3 and runc under load) gets one more try with a fresh sandbox: idempotent retry.
        ``call_id``: the tool call it is made for, if known (recorded with it).
        """
        return self._create_once(config, command, retry_start=True, call_id=call_id)

    def _create_once(
        self, config: SandboxConfig, command: list[str], *, retry_start: bool, call_id: str = ""
    ) -> Sandbox:
        sandbox_id = uuid.uuid4().hex[:12]
        sandbox = Sandbox(
            sandbox_id=sandbox_id,
            template=config.template,
            name=f"fluffy-{config.template}-{sandbox_id}",
            output_dir=self.root / "outputs" / self.session_id / sandbox_id,
            call_id=call_id,
        )
        self.active[sandbox_id] = sandbox
        try:
            try:
                sandbox.output_dir = self._output_dir(sandbox_id)
            except OSError as exc:
                raise SandboxConfigError(
                    f"cannot make the output folder {sandbox.output_dir}: {exc.strerror}",
                    why="each sandbox writes only into its own fresh folder",
                    fix="Check that FLUFFY_HOME is writable (`fluffy doctor`).",
                ) from exc
            spec = self._spec(sandbox, config, command)
            sandbox.container_id = self.runtime.create(spec)
        except BaseException as exc:
            self._abandon(sandbox, FailureReason.CREATE_FAILED, exc, "create")
            raise
        try:
            self.runtime.start(sandbox.container_id)
        except EngineOperationFailed as exc:
            self._abandon(sandbox, FailureReason.START_FAILED, exc, "start")
            if retry_start:
                return self._create_once(config, command, retry_start=False, call_id=call_id)
            raise
        except BaseException as exc:
            self._abandon(sandbox, FailureReason.START_FAILED, exc, "start")
            raise
        sandbox.move(SandboxState.RUNNING)
        self._tell(
            "created",
            sandbox,
            {
                "template": config.template,
                "image": spec.image,
                "seccomp_profile": config.seccomp_profile,
                "memory_limit": config.memory_limit,
                "cpu_limit": config.cpu_limit,
                "max_pids": config.max_pids,
                "network": config.network_mode,
                "container_id": (sandbox.container_id or "")[:12],
                "call_id": call_id or "(none yet: made ahead of its call)",
            },
        )
        return sandbox

    def _abandon(
        self, sandbox: Sandbox, reason: FailureReason, exc: BaseException, step: str
    ) -> None:
        """FAILED, cleaned up, and the error told where it happened (re-raised by caller)."""
        sandbox.fail(reason)
        self._tell("failed", sandbox, {"reason": reason, "step": step, "error": str(exc)[:500]})
        self.destroy(sandbox)
        if isinstance(exc, FluffyError):
            exc.with_context(f"cannot {step} sandbox {sandbox.name}")

    def wait(self, sandbox: Sandbox, timeout_ms: int) -> Sandbox:
        """Wait for the command; RUNNING -> STOPPING, or FAILED on timeout/OOM/crash."""
        assert sandbox.container_id is not None
        try:
            sandbox.exit_code = self.runtime.wait(sandbox.container_id, timeout_ms / 1000)
        except EngineTimeout:
            with contextlib.suppress(FluffyError):
                self.runtime.kill(sandbox.container_id)
            self.mark_failed(sandbox, FailureReason.TIMEOUT, f"still running after {timeout_ms} ms")
            return sandbox
        state = self.runtime.inspect(sandbox.container_id)
        sigkill_unexplained = sandbox.exit_code == _SIGKILL_EXIT and not self.runtime.reports_oom
        if state.oom_killed or sigkill_unexplained:
            self.mark_failed(sandbox, FailureReason.OOM, f"exit code {sandbox.exit_code}")
        elif state.error or (sandbox.exit_code or 0) > _SIGNAL_EXIT:
            why = state.error or f"exit code {sandbox.exit_code}"
            self.mark_failed(sandbox, FailureReason.CRASH, why)
        else:
            sandbox.move(SandboxState.STOPPING)
        return sandbox

    def mark_failed(self, sandbox: Sandbox, reason: FailureReason, why: str) -> None:
        """RUNNING -> FAILED (time limit, OOM, crash), told to the observer once."""
        if sandbox.state is not SandboxState.RUNNING:
            return
        sandbox.fail(reason)
        self._tell("failed", sandbox, {"reason": reason, "error": why[:500]})

    def destroy(self, sandbox: Sandbox) -> Sandbox:
        """CLEANUP, step by step (each step runs even if an earlier one failed)."""
        if sandbox.state is SandboxState.DESTROYED:
            return sandbox
        if sandbox.state is SandboxState.CREATING:  # interrupted while being made
            sandbox.fail(FailureReason.CREATE_FAILED)
        if sandbox.state is SandboxState.RUNNING:
            sandbox.move(SandboxState.STOPPING)
        if sandbox.state is not SandboxState.CLEANUP:
            sandbox.move(SandboxState.CLEANUP)
        container_id = sandbox.container_id
        steps: list[tuple[str, Callable[[], None]]] = []
        if container_id and sandbox.exit_code is None:  # still running, or unknown
            steps.append(("stop", lambda: self._stop_if_running(container_id)))
        if container_id:
            steps.append(("remove container", lambda: self._remove_container(container_id)))
        steps.append(("remove output dir", lambda: self._remove_dir(sandbox.output_dir)))
        for label, step in steps:
            try:
                step()
            except (FluffyError, OSError) as exc:
                sandbox.cleanup_errors.append(f"{label}: {exc}")
        sandbox.move(SandboxState.DESTROYED)
        self.active.pop(sandbox.sandbox_id, None)
        self._tell(
            "destroyed",
            sandbox,
            {
                "template": sandbox.template,
                "exit_code": "" if sandbox.exit_code is None else sandbox.exit_code,
                "failure": sandbox.failure or "",
                "call_id": sandbox.call_id or "(none: never handed a call)",
                "lived_ms": round((sandbox.history[-1][1] - sandbox.history[0][1]) * 1000, 1),
                "cleanup_errors": "; ".join(sandbox.cleanup_errors)[:500],
            },
        )
        return sandbox

    def _stop_if_running(self, container_id: str) -> None:
        if self.runtime.inspect(container_id).status is ContainerStatus.RUNNING:
            self.runtime.kill(container_id)

    def _remove_container(self, container_id: str) -> None:
        with contextlib.suppress(EngineNotFound):
            self.runtime.remove(container_id)

    @staticmethod
    def _remove_dir(path: Path) -> None:
        if path.exists():
            shutil.rmtree(path)

    def run(
        self,
        config: SandboxConfig,
        command: list[str],
        *,
        on_output: Callable[[str], None] | None = None,
        keep: bool = False,
    ) -> RunOutcome:
        """Create, run to the end (or the time limit), collect output, destroy.

        ``keep=True`` leaves the sandbox (container and output folder) for the caller to
        inspect; the caller then calls :meth:`destroy`.
        """
        sandbox = self.create(config, command)
        assert sandbox.container_id is not None
        container_id = sandbox.container_id
        streamer: threading.Thread | None = None
        if on_output is not None:

            def pump() -> None:
                with contextlib.suppress(FluffyError):
                    for chunk in self.runtime.logs(container_id, follow=True):
                        on_output(chunk)

            streamer = threading.Thread(target=pump, name=f"logs-{sandbox.name}", daemon=True)
            streamer.start()
        try:
            self.wait(sandbox, config.max_duration_ms)
            if streamer is not None:
                streamer.join(timeout=5)
            stdout, stderr = self.runtime.output(container_id)
            exit_code = sandbox.exit_code
        finally:
            if not keep:
                self.destroy(sandbox)
        return RunOutcome(sandbox, exit_code, stdout, stderr)

    # -- garbage --------------------------------------------------------------------
    def live_sessions(self) -> set[str]:
        live = {self.session_id}
        for path in (self.root / "sessions").glob("*"):
            try:
                pid = int(path.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid_alive(pid):
                live.add(path.name)
            elif path.name != self.session_id:
                with contextlib.suppress(OSError):
                    path.unlink()
        return live

    def collect_garbage(self) -> GarbageReport:
        """Remove containers, volumes and output dirs of sessions that no longer run.

        Only those made under this manager's folder: its session files are the only
        sessions it can tell alive or dead.  Another folder's sandbox (a running kernel's
        pool and calls, another fluffy home's) is never touched; a crashed kernel's are
        removed by the next kernel of its project (:meth:`remove_strays`)."""
        report = GarbageReport()
        live = self.live_sessions()
        ours = {LABEL_MANAGED: "1", LABEL_ROOT: self.root_label}
        for state in self.runtime.list_containers(ours):
            session = state.labels.get(LABEL_SESSION, "")
            if session in live:
                continue
            try:
                self.runtime.remove(state.id)
                report.containers.append(state.id)
            except FluffyError as exc:
                report.errors.append(f"container {state.id[:12]}: {exc}")
        for name, labels in self.runtime.list_volumes(ours).items():
            if labels.get(LABEL_SESSION, "") in live:
                continue
            try:
                self.runtime.remove_volume(name)
                report.volumes.append(name)
            except FluffyError as exc:
                report.errors.append(f"volume {name}: {exc}")
        outputs = self.root / "outputs"
        for session_dir in outputs.glob("*") if outputs.exists() else []:
            if session_dir.name not in live:
                try:
                    shutil.rmtree(session_dir)
                    report.output_dirs.append(str(session_dir))
                except OSError as exc:
                    report.errors.append(f"{session_dir}: {exc}")
        return report

    def remove_strays(self) -> GarbageReport:
        """Containers carrying this manager's labels (e.g. its project) but another
        session's: left by an earlier owner of those labels that died (one kernel per
        project, so none of them is alive).  Pids cannot tell across L1 restarts."""
        report = GarbageReport()
        for state in self.runtime.list_containers({**self.labels, LABEL_MANAGED: "1"}):
            if state.labels.get(LABEL_SESSION) == self.session_id:
                continue
            try:
                self.runtime.remove(state.id)
                report.containers.append(state.id)
            except FluffyError as exc:
                report.errors.append(f"container {state.id[:12]}: {exc}")
        return report

    def close(self) -> None:
        """Destroy what is still active and end the session."""
        for sandbox in list(self.active.values()):
            self.destroy(sandbox)
        with contextlib.suppress(OSError):
            self._session_file.unlink()
        with contextlib.suppress(OSError):
            (self.root / "outputs" / self.session_id).rmdir()
