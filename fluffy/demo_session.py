"""`fluffy demo --session`: the design's end-to-end scenario as an AI session.

A fresh copy of the demo project (a git repository) gets its kernel in an L1 container
under the bootstrap; the task goes to the kernel's session loop (``session.message``),
whose model runs in an ai-provider sandbox: offline, the scripted provider replays
examples/sessions/add-error-handling.yaml (what an AI would call, no API key); with a
key or base URL set, a real model gets the task.  Its calls go through the tool path:
fast-path reads, writes in fs-tool sandboxes (staged, never written directly), test
runs in test-tool sandboxes driving the TDD state machine, the merge, and a commit
prepared by git-tool.  Scripted, each call's expectation (state reached, or error
answered) is checked; at the end the audit chain is verified and the kernel stopped.
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

import msgspec

from fluffy.host.sessions import Expect, SessionScript, load_script
from fluffy.ipc.client import SyncClient
from fluffy.ipc.results.events import (
    Committed,
    StateChanged,
    ToolFinished,
    ToolStarted,
    TurnEnded,
)
from fluffy.paths import fluffy_home, package_root

__all__ = ["DEFAULT_SCRIPT", "SessionDemo", "fresh_project", "load_script", "play"]

SCRIPTS = package_root().parent / "examples" / "sessions"
DEFAULT_SCRIPT = SCRIPTS / "add-error-handling.yaml"
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "fluffy demo",
    "GIT_AUTHOR_EMAIL": "demo@fluffy.invalid",
    "GIT_COMMITTER_NAME": "fluffy demo",
    "GIT_COMMITTER_EMAIL": "demo@fluffy.invalid",
}


@dataclass
class CallResult:
    """One tool call of the session, with the expectation the script attached to it."""

    tool: str
    ok: bool
    summary: str
    duration_ms: float
    error: dict[str, Any] | None = None
    state: str | None = None  # the session's state once the call was done
    expect: Expect | None = None
    problem: str | None = None


@dataclass
class SessionDemo:
    project: Path
    provider: str = "scripted"
    session_id: str = ""
    calls: list[CallResult] = field(default_factory=list)
    commit: str = ""
    status: str = ""
    error: dict[str, Any] | None = None
    audit_ok: bool = False
    seconds: float = 0.0

    @property
    def problems(self) -> list[str]:
        found = [f"{c.tool}: {c.problem}" for c in self.calls if c.problem]
        if self.status != "done":
            found.append(f"the turn ended {self.status or 'without an end'}: {self.error}")
        if not self.commit:
            found.append("nothing was committed")
        return found

    @property
    def ok(self) -> bool:
        return self.audit_ok and not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "project": str(self.project),
            "provider": self.provider,
            "session_id": self.session_id,
            "commit": self.commit,
            "status": self.status,
            "audit_verified": self.audit_ok,
            "seconds": round(self.seconds, 3),
            "problems": self.problems,
            "calls": [
                {
                    "tool": c.tool,
                    "ok": c.ok,
                    "summary": c.summary,
                    "state": c.state,
                    "duration_ms": c.duration_ms,
                    "problem": c.problem,
                }
                for c in self.calls
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
    """A new copy of the demo project under FLUFFY_HOME, as a git repository -- made the
    way a user makes one (owned by whoever runs fluffy, modes as the umask gives them)."""
    root = fluffy_home() / "demo-sessions" / time.strftime("%Y%m%d-%H%M%S")
    project = root / "project"
    shutil.copytree(source, project)
    init_repository(project)
    return project


def _check(call: CallResult) -> str | None:
    expect = call.expect
    if expect is None:
        return None
    error = call.error or {}
    if expect.error is not None:
        got = {error.get("error"), error.get("code")}
        if call.ok or expect.error not in got:
            return f"expected the error {expect.error}, got {error.get('code') or 'success'}"
        return None
    if not call.ok:
        return f"{error.get('code')}: {error.get('what')} ({error.get('why')})"
    if expect.state is not None and call.state != expect.state:
        return f"expected state {expect.state}, the session is in {call.state}"
    return None


def collect(events: list[object], demo: SessionDemo, expectations: list[Expect] | None) -> None:
    """The calls, their states and the commit, from a turn's events (checked if scripted)."""
    calls: dict[str, CallResult] = {}
    last: CallResult | None = None
    for event in events:
        if isinstance(event, ToolFinished):
            last = CallResult(
                tool=event.tool_name,
                ok=event.ok,
                summary=event.summary,
                duration_ms=event.duration_ms,
                error=msgspec.to_builtins(event.error),  # as the wire carries it
            )
            calls[event.call_id] = last
            demo.calls.append(last)
        elif isinstance(event, StateChanged) and last is not None:
            last.state = event.to
        elif isinstance(event, ToolStarted):
            last = None
        elif isinstance(event, Committed):
            demo.commit = event.sha or ""
        elif isinstance(event, TurnEnded):
            demo.status = event.status
            demo.error = msgspec.to_builtins(event.error)
    state = None
    for call in demo.calls:  # a call that changed nothing leaves the state as it was
        state = call.state or state
        call.state = state
    if expectations is not None:
        for call, expect in zip(demo.calls, expectations, strict=False):
            call.expect = expect
            call.problem = _check(call)
        if len(demo.calls) != len(expectations):
            demo.calls.append(
                CallResult(
                    "script",
                    False,
                    "",
                    0.0,
                    problem=f"{len(expectations)} calls scripted, {len(demo.calls)} made",
                )
            )


def play(
    socket: Path,
    project: Path,
    script: SessionScript,
    provider: dict[str, Any],
    renderer: Any,
    follow: Callable[..., object],
) -> SessionDemo:
    """Send the task, let the kernel's session loop run it, and follow its events.

    ``follow`` is the CLI's :func:`fluffy.cli.turns.follow`, passed in by the command
    so that this module, which tests and benchmarks import, never imports the CLI.
    """
    demo = SessionDemo(project, provider=str(provider.get("name")))
    started = time.perf_counter()
    seen: list[object] = []

    class Recording:
        def render(self, event: object) -> None:
            seen.append(event)
            renderer.render(event)

    with SyncClient(str(socket), timeout=900) as client:
        demo.session_id = client.call("session.create")["session_id"]
        turn = client.call(
            "session.message",
            {
                "session_id": demo.session_id,
                "text": script.task,
                "provider": provider,
                "auto_approve": True,
            },
        )
        follow(
            client,
            demo.session_id,
            0,
            Recording(),
            on_review=lambda _: "approve",
            turn_id=turn["turn_id"],
        )
    demo.seconds = time.perf_counter() - started
    scripted = provider.get("name") == "scripted"
    collect(seen, demo, script.expectations() if scripted else None)
    return demo


def verify_audit(state: Path, witness: Path) -> bool:
    from fluffy.host.audit import read_head, verify

    head = read_head(witness) if witness.exists() else None
    return verify(state, witness=head).ok
