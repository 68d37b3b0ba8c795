"""A real `fluffy kernel serve` on a copy of the demo project, with a real engine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from fluffy.demo_session import init_repository
from fluffy.ipc.client import SyncClient

FLUFFY = str(Path(sys.executable).parent / "fluffy")
DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-project"


def demo_project(tmp_path: Path) -> Path:
    """The demo project as a git repository with one commit (world-readable)."""
    project = tmp_path / "project"
    shutil.copytree(DEMO, project)
    init_repository(project)
    for path in [project, *project.rglob("*")]:  # the sandbox user reads it
        path.chmod(0o755 if path.is_dir() else 0o644)
    tmp_path.chmod(0o755)
    return project


class Kernel:
    def __init__(self, tmp_path: Path, project: Path, runtime: str, **env: str) -> None:
        self.sock = tmp_path / "run" / "kernel.sock"
        self.state = tmp_path / "state"
        self.project = project
        self.env = {**os.environ, "FLUFFY_RUNTIME": runtime, **env}
        self.proc: subprocess.Popen[str] | None = None
        #: What runs `fluffy` (a test may put its own entry point in front of it).
        self.launcher = [FLUFFY]

    def start(self) -> Kernel:
        self.sock.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [*self.launcher, "kernel", "serve", "--socket", str(self.sock), "--state-dir",
             str(self.state), "--project", str(self.project)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not self.sock.exists():
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            assert time.monotonic() < deadline, "the kernel did not create its socket"
            time.sleep(0.05)
        return self

    def client(self, timeout: float = 600) -> SyncClient:
        return SyncClient(str(self.sock), timeout=timeout)

    def stop(self) -> str:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return err

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.communicate(timeout=30)

    def audit(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [FLUFFY, "audit", *args, "--state-dir", str(self.state)],
            capture_output=True,
            text=True,
        )

    def entries(self, event_type: str) -> list[dict[str, Any]]:
        out = self.audit("log", "--type", event_type, "--json")
        assert out.returncode == 0, out.stderr
        return list(json.loads(out.stdout)["entries"])


def git(project: Path, *args: str) -> str:
    """``git -C project ARGS``'s output, stripped (any owner: the kernel may be another uid)."""
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(project), *args],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def call(client: SyncClient, session: str, tool: str, **args: Any) -> dict[str, Any]:
    answer: dict[str, Any] = client.call(
        "tool.call", {"session_id": session, "tool": tool, "args": args}
    )
    return answer


Steps = list[tuple[str, dict[str, Any]]]


def drive(
    tmp_path: Path,
    project: Path,
    runtime: str,
    steps: Steps,
    *,
    before: Callable[[int], None] | None = None,
    commit: str | None = None,
    review: bool = False,
    refused: Collection[int] = (),
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A model's tool calls through a real kernel, each of which must succeed but the
    steps numbered in ``refused``, which must fail: their answers, and ``review.show``
    at the end when ``review``.  ``before(n)`` runs before step ``n`` (the person's edit
    while the model works); ``commit``: git.commit with that message once the session
    reaches committing (its answer appended as it is)."""
    kernel = Kernel(tmp_path, project, runtime).start()
    try:
        with kernel.client() as client:
            sid = client.call("session.create")["session_id"]
            client.call("session.message", {"session_id": sid, "text": "add sub"})
            answers = []
            for number, (tool, args) in enumerate(steps):
                if before is not None:
                    before(number)
                answer = call(client, sid, tool, **args)
                assert answer["ok"] is (number not in refused), (number, tool, answer.get("error"))
                answers.append(answer)
            if commit is not None and answers[-1]["session"]["state"] == "committing":
                answers.append(call(client, sid, "git.commit", message=commit))
            shown = client.call("review.show", {"session_id": sid}) if review else {}
            return answers, shown
    finally:
        kernel.stop()
