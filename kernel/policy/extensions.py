"""Extension rules, evaluated in a long-running, pre-warmed policy sandbox.

The kernel starts one ``policy-sandbox`` container (strict seccomp, no network, the rule
files mounted read-only) running :mod:`fluffy.sandboxes.policy_host`, which connects to
its own kernel socket and long-polls for work (``policy.next``), answering with
``policy.verdict`` (declared like the kernel's syscalls: typed params, decoded strictly
before a handler runs, callable on the policy sandbox's own socket only).  Calling an
:class:`ExtensionHost` is the engine's extension rule: it waits at most 100 ms (design);
a timeout, a crash or a broken answer is a deny, and the sandbox is restarted (an
answer whose params do not decode is refused to the sandbox and never resolves the
job: it times out, a deny).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import FluffyError, SandboxRunFailed
from fluffy.ipc.results.sandbox import PolicyJob
from fluffy.kernel.containers.config import template_config
from fluffy.kernel.containers.lifecycle import Sandbox
from fluffy.kernel.containers.manager import ContainerManager
from fluffy.kernel.containers.sandboxio import socket_dir as sandbox_socket_dir
from fluffy.kernel.ipc.server import CallContext, KernelServer
from fluffy.kernel.ipc.syscalls import NoParams, OwnSocket, Syscall, SyscallTable
from fluffy.kernel.policy.engine import Request, Verdict, Vote

log = logging.getLogger("fluffy.kernel.policy")

EVALUATION_TIMEOUT_S = 0.1
RESTART_ATTEMPTS = 4
START_TIMEOUT_S = 30.0
#: The policy sandbox, on its own socket (binding ``policy-sandbox``).
POLICY_SANDBOX = OwnSocket("policy-sandbox", "the policy sandbox")


class RuleVote(msgspec.Struct, forbid_unknown_fields=True):
    """One extension rule's vote (``fluffy.sandboxes.policy_host.run_rules``)."""

    rule: str
    vote: Vote
    reason: str


class VerdictParams(msgspec.Struct, forbid_unknown_fields=True):
    """``policy.verdict``: the rules' votes on the job ``policy.next`` handed out."""

    job: str
    verdicts: list[RuleVote]


def extension_syscalls(host: ExtensionHost) -> SyscallTable:
    """What the policy sandbox's socket serves (to that sandbox only)."""
    own = POLICY_SANDBOX
    return SyscallTable(
        [
            Syscall("policy.next", NoParams, host._next, PolicyJob, since=1, callers=own),
            Syscall("policy.verdict", VerdictParams, host._verdict, None, since=1, callers=own),
        ]
    )


class ExtensionHost:
    """One policy sandbox and the IPC plumbing to it (its own event-loop thread)."""

    def __init__(
        self,
        manager: ContainerManager,
        rules_dir: Path,
        *,
        timeout_s: float = EVALUATION_TIMEOUT_S,
    ) -> None:
        self.manager = manager
        self.rules_dir = rules_dir.resolve()
        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="policy-ext", daemon=True)
        self.server = KernelServer(extension_syscalls(self))
        self.jobs: asyncio.Queue[tuple[str, dict[str, Any]]] | None = None
        self.pending: dict[str, Future[list[Verdict]]] = {}
        self.sandbox: Sandbox | None = None
        self.restarts = 0
        self._ids = itertools.count(1)
        self._connected: asyncio.Event | None = None
        self._lock = threading.Lock()
        #: Set once the sandbox has connected and answered its warm-up evaluation.
        self.ready = threading.Event()
        self.last_error: BaseException | None = None
        self._snapshots: list[Path] = []
        self._folders: list[Path] = []
        self._pending_lock = threading.Lock()
        self._restarting = False
        self._flag_lock = threading.Lock()  # never held long: the restart flag only
        self.__name__ = "extension-rules"  # how a failure is named in the decision
        #: frees its scheduler slot (set by ProjectRules; restarts keep the one slot)
        self.release_slot: Callable[[], None] | None = None

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()
        self._call(self._setup())
        try:
            self._launch()
        except BaseException:
            self.stop()
            raise

    async def _setup(self) -> None:
        self.jobs = asyncio.Queue()
        self._connected = asyncio.Event()

    def _launch(self) -> None:
        socket_dir, options = sandbox_socket_dir(
            self.manager.root, f"policy-{uuid.uuid4().hex[:12]}"
        )
        self._folders.append(socket_dir)
        self._call(
            self.server.listen(
                socket_dir / "kernel.sock", binding=POLICY_SANDBOX.binding(), **options
            )
        )
        config = template_config(
            "policy-sandbox",
            project_dir=self._snapshot_rules(),
            kernel_socket_dir=socket_dir,
            max_duration="24h",  # the container lives long; each evaluation has 100 ms
        )
        self.sandbox = self.manager.create(
            config, ["python3", "-I", "-m", "fluffy.sandboxes.policy_host"]
        )
        try:  # pre-warm: the first evaluation pays for imports and rule loading
            self._wait_connected(START_TIMEOUT_S)
            self.evaluate_raw(
                {"syscall": "kernel.warmup", "caller": {"name": "kernel"}}, START_TIMEOUT_S
            )
        except FluffyError:
            self._stop_sandbox()  # the host itself lives on: a later restart may succeed
            raise
        self.ready.set()

    def _snapshot_rules(self) -> Path:
        """A copy of the rule files the sandbox user can read (and that cannot change)."""
        snapshot = self.manager.root / "policy-rules" / uuid.uuid4().hex[:12]
        snapshot.mkdir(parents=True)
        snapshot.parent.chmod(0o755)
        snapshot.chmod(0o755)
        for rule in sorted(self.rules_dir.glob("*.py")):
            target = snapshot / rule.name
            shutil.copyfile(rule, target)
            target.chmod(0o644)
        self._snapshots.append(snapshot)
        return snapshot

    def _wait_connected(self, timeout: float) -> None:
        assert self._connected is not None
        try:
            self._call(asyncio.wait_for(self._connected.wait(), timeout), timeout + 1)
        except (TimeoutError, FutureTimeout):
            logs = ""
            if self.sandbox and self.sandbox.container_id:
                with contextlib.suppress(FluffyError):
                    logs = "".join(self.manager.runtime.logs(self.sandbox.container_id))
            raise SandboxRunFailed(
                "the policy sandbox did not connect to the kernel",
                why=logs.strip()[-1500:] or "no output",
                fix="Check the rule files (they load at start) and `fluffy doctor`.",
            ) from None

    def restart(self) -> None:
        with self._lock:
            self.ready.clear()
            self.restarts += 1
            self._stop_sandbox()
            self._call(self._setup())
            self._launch()

    def _stop_sandbox(self) -> None:
        if self.sandbox is not None:
            self.manager.destroy(self.sandbox)
            self.sandbox = None
        self._call(self.server.close())
        for folder in (*self._snapshots, *self._folders):
            shutil.rmtree(folder, ignore_errors=True)
        self._snapshots.clear()
        self._folders.clear()
        with self._pending_lock:
            pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(SandboxRunFailed("the policy sandbox was restarted"))

    def stop(self) -> None:
        if self.thread.is_alive():
            self._stop_sandbox()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
        self.loop.close()

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # -- IPC methods (run on the host's loop) ---------------------------------------
    async def _next(self, context: CallContext, params: NoParams) -> dict[str, Any]:
        assert self.jobs is not None and self._connected is not None
        self._connected.set()
        job_id, request = await self.jobs.get()
        return {"job": job_id, "request": request}

    def _verdict(self, context: CallContext, params: VerdictParams) -> None:
        with self._pending_lock:
            future = self.pending.pop(params.job, None)
        if future is None or future.done():
            return
        future.set_result(
            [Verdict(f"ext:{v.rule}", "extension", v.vote, v.reason) for v in params.verdicts]
        )

    # -- evaluation -------------------------------------------------------------------
    def evaluate_raw(self, request: dict[str, Any], timeout: float) -> list[Verdict]:
        job_id = str(next(self._ids))
        future: Future[list[Verdict]] = Future()
        with self._pending_lock:
            self.pending[job_id] = future
        assert self.jobs is not None
        self.loop.call_soon_threadsafe(self.jobs.put_nowait, (job_id, request))
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise SandboxRunFailed(
                f"extension rules did not answer within {timeout * 1000:.0f} ms",
                why="extension rules have a time budget per request, and a slow rule denies "
                "rather than waits",
                fix="Make the rule faster, or remove it from .fluffy/rules/.",
            ) from None
        finally:
            with self._pending_lock:
                self.pending.pop(job_id, None)

    def __call__(self, request: Request) -> Iterator[Verdict]:
        """The engine's extension rule.  Any failure raises: the engine denies."""
        payload = {
            "syscall": request.syscall,
            "path": request.path,
            "caller": {"name": request.caller.name, "tags": sorted(request.caller.tags)},
            "state": request.state,
            "mode": request.mode,
            "size": request.size,
            "sandbox": request.sandbox,
            "command": list(request.command) if request.command is not None else None,
        }
        if not self.ready.is_set():
            raise SandboxRunFailed(
                "the policy sandbox is restarting; denied meanwhile",
                why="its previous run failed or timed out, and extension rules fail closed until "
                "it is back",
                fix="Retry in a few seconds; the kernel's log says why the policy sandbox "
                "restarted.",
            )
        try:
            return iter(self.evaluate_raw(payload, self.timeout_s))
        except FluffyError:
            self.ready.clear()  # deny everything until the restart is done
            with self._flag_lock:
                start = not self._restarting  # one restart at a time, however many fail
                self._restarting = True
            if start:
                threading.Thread(target=self._restart_quietly, daemon=True).start()
            raise

    def _restart_quietly(self) -> None:
        """Restart with a few retries (engines fail a container start now and then)."""
        try:
            self._restart_with_retries()
        finally:
            with self._flag_lock:
                self._restarting = False

    def _restart_with_retries(self) -> None:
        for attempt in range(RESTART_ATTEMPTS):
            try:
                self.restart()
                return
            except Exception as exc:  # keep denying meanwhile; say why in the log
                self.last_error = exc
                log.warning(
                    "restarting the policy sandbox failed (attempt %d): %s", attempt + 1, exc
                )
                time.sleep(0.5 * 2**attempt)
