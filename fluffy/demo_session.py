"""`fluffy demo --session`: the design's end-to-end scenario through the real kernel.

A fresh copy of the demo project (a git repository) gets its kernel in an L1 container
under the bootstrap; a session then plays the tool calls of a script
(examples/sessions/*.yaml: what an AI would call, no model needed) through the kernel's
IPC: fast-path reads, writes in fs-tool sandboxes (staged, never written directly), test
runs in test-tool sandboxes driving the TDD state machine, the merge, and a commit
prepared by git-tool.  Each step's expectation (state reached, or error answered) is
checked; at the end the audit chain is verified and the kernel stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fluffy.errors import ConfigError
from fluffy.ipc.client import SyncClient
from fluffy.paths import fluffy_home, package_root

SCRIPTS = package_root().parent / "examples" / "sessions"
DEFAULT_SCRIPT = SCRIPTS / "add-error-handling.yaml"
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "fluffy demo",
    "GIT_AUTHOR_EMAIL": "demo@fluffy.invalid",
    "GIT_COMMITTER_NAME": "fluffy demo",
    "GIT_COMMITTER_EMAIL": "demo@fluffy.invalid",
}


class Expect(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    state: str | None = None
    error: str | None = None


class ScriptStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    say: str = ""
    tool: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)
    expect: Expect = Field(default_factory=Expect)


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field(min_length=1)
    steps: list[ScriptStep] = Field(min_length=1)


def load_script(path: Path) -> Script:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return Script.model_validate(data)
    except OSError as exc:
        raise ConfigError(f"cannot read the session script {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(
            f"{path}: {where}: {first['msg']}", fix="Correct the script (see its comments)."
        ) from None


@dataclass
class StepResult:
    step: ScriptStep
    answer: dict[str, Any]
    seconds: float
    problem: str | None = None

    @property
    def state(self) -> str | None:
        session = self.answer.get("session") or {}
        return session.get("state")


@dataclass
class SessionDemo:
    project: Path
    session_id: str = ""
    results: list[StepResult] = field(default_factory=list)
    commit: str = ""
    audit_ok: bool = False

    @property
    def ok(self) -> bool:
        return self.audit_ok and all(r.problem is None for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "project": str(self.project),
            "session_id": self.session_id,
            "commit": self.commit,
            "audit_verified": self.audit_ok,
            "steps": [
                {
                    "tool": r.step.tool,
                    "ok": r.answer.get("ok"),
                    "route": r.answer.get("route"),
                    "state": r.state,
                    "seconds": round(r.seconds, 3),
                    "problem": r.problem,
                }
                for r in self.results
            ],
        }


def git(project: Path, *args: str) -> str:
    """Run git in ``project`` with a fixed identity (the demo's, tests', benchmarks')."""
    return subprocess.run(
        ["git", "-C", str(project), *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **GIT_IDENTITY},
    ).stdout.strip()


def init_repository(project: Path) -> None:
    """Make ``project`` a git repository on branch main with one commit of everything."""
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "The demo project as shipped")


def fresh_project(source: Path) -> Path:
    """A new copy of the demo project under FLUFFY_HOME, as a git repository."""
    root = fluffy_home() / "demo-sessions" / time.strftime("%Y%m%d-%H%M%S")
    project = root / "project"
    shutil.copytree(source, project)
    init_repository(project)
    if os.geteuid() == 0:  # a user's project belongs to the user; the kernel runs as it
        from fluffy.bootstrap.l1 import KERNEL_UID

        for path in [project, *project.rglob("*")]:
            os.lchown(path, KERNEL_UID, KERNEL_UID)
    return project


def _problem(step: ScriptStep, answer: dict[str, Any]) -> str | None:
    error = answer.get("error") or {}
    if step.expect.error is not None:
        got = error.get("error") or error.get("code")
        if answer.get("ok") or got != step.expect.error:
            return f"expected the error {step.expect.error}, got {got or 'success'}"
    elif not answer.get("ok"):
        return f"{error.get('code')}: {error.get('what')} ({error.get('why')})"
    state = (answer.get("session") or {}).get("state")
    if step.expect.state is not None and state != step.expect.state:
        notes = (answer.get("output") or {}).get("workflow") or []
        return f"expected state {step.expect.state}, the session is in {state}: {notes}"
    return None


def play(
    socket: Path,
    project: Path,
    script: Script,
    on_step: Callable[[StepResult], None] = lambda _: None,
) -> SessionDemo:
    demo = SessionDemo(project)
    with SyncClient(str(socket), timeout=900) as client:
        demo.session_id = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": demo.session_id, "text": script.task})
        for step in script.steps:
            started = time.perf_counter()
            answer = client.call(
                "tool.call",
                {"session_id": demo.session_id, "tool": step.tool, "args": step.args},
            )
            result = StepResult(step, answer, time.perf_counter() - started)
            result.problem = _problem(step, answer)
            demo.results.append(result)
            on_step(result)
            if result.problem is not None:
                break
            if step.tool == "git.commit":
                demo.commit = str((answer.get("output") or {}).get("commit") or "")
    return demo


def verify_audit(state: Path, witness: Path) -> bool:
    from fluffy.kernel.audit.store import read_head
    from fluffy.kernel.audit.verify import verify

    head = read_head(witness) if witness.exists() else None
    return verify(state, witness=head).ok
