"""A project kernel started by `fluffy start` (the real bootstrap and L1 kernel), for
end-to-end tests that drive it through the CLI and its socket."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fluffy.demo_session import init_repository
from tests.conftest import connect_engine

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-project"
FLUFFY = str(Path(sys.executable).parent / "fluffy")


@contextlib.contextmanager
def project_kernel(
    runtime: str, base: Path, prepare: Callable[[Path], None]
) -> Iterator[dict[str, Any]]:
    """A copy of the demo project in ``base`` (changed by ``prepare`` before its first
    commit, owned by a user when run as root) and its kernel, started on ``runtime``;
    yields the kit (project, env, state, socket, base) and stops the kernel after."""
    from fluffy.bootstrap.supervisor import paths
    from fluffy.images.builder import build_images

    with connect_engine(runtime) as connected:
        image = {status.name: status.ref for status in build_images(connected)}["kernel"]
    project = base / "project"
    shutil.copytree(DEMO, project)
    prepare(project)
    init_repository(project)
    if os.getuid() == 0:  # a user's project is theirs: the kernel runs as its owner
        for path in [project, *project.rglob("*")]:
            os.lchown(path, 1000, 1000)
    home = base / "home"
    kit: dict[str, Any] = {
        "project": project,
        "env": {
            **{k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
            "FLUFFY_HOME": str(home),
            "FLUFFY_KERNEL_IMAGE": image,
            "FLUFFY_RUNTIME": runtime,
        },
        "state": paths(home, str(project))["state"],
        "socket": paths(home, str(project))["run"] / "kernel.sock",
        "base": base,
    }
    started = fluffy(kit, "start", "--project", str(project))
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield kit
    finally:
        fluffy(kit, "stop", "--project", str(project))


def fluffy(
    kit: dict[str, Any], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLUFFY, *args],
        env=kit["env"],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def audit(kit: dict[str, Any], event_type: str) -> list[dict[str, Any]]:
    out = fluffy(kit, "audit", "log", "--state-dir", str(kit["state"]), "--type", event_type,
                 "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout)["entries"])


def reviewed_script(folder: Path, note: str = "# error handling added") -> Path:
    """The demo scenario (examples/sessions/add-error-handling.yaml) plus a change to
    pyproject.toml, a sensitive file, so the merge waits for the person; ``note``: the
    line the change adds.  Written to ``folder``/script.yaml."""
    import yaml

    data = yaml.safe_load((ROOT / "examples/sessions/add-error-handling.yaml").read_text())
    steps = data["steps"]
    at = next(
        i
        for i, s in enumerate(steps)
        if s["tool"] == "fs.write" and "ConfigError" in str(s["args"].get("content", ""))
    )
    pyproject = (DEMO / "pyproject.toml").read_text() + f"{note}\n"
    steps.insert(
        at + 1,
        {"say": "Note it in pyproject.toml (sensitive: reviewed).", "tool": "fs.write",
         "args": {"path": "pyproject.toml", "content": pyproject}},
    )  # fmt: skip
    path = folder / "script.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def user_project(
    base: Path,
    kernel_image: str,
    *,
    prepare: Callable[[Path], None] | None = None,
    repository: bool = True,
) -> tuple[Path, dict[str, str]]:
    """A copy of the demo project in ``base`` (``prepare`` changes it first; a git
    repository unless ``repository`` is False), owned by a user when run as root, and
    the environment `fluffy` runs in for it (its own FLUFFY_HOME, no API key).  The home
    gets this run's image manifest, so its kernel's sandboxes use the images this
    checkout built (without one a kernel takes the newest build on the engine, which
    another checkout's may be)."""
    from fluffy.images.builder import manifest_path

    home_state = base / "home" / "state"
    home_state.mkdir(parents=True)
    shutil.copyfile(manifest_path(), home_state / "images.json")
    project = base / "project"
    shutil.copytree(DEMO, project)
    if prepare is not None:
        prepare(project)
    if repository:
        init_repository(project)
    if os.getuid() == 0:  # a user's project is theirs: the kernel runs as its owner
        for path in [project, *project.rglob("*")]:
            os.lchown(path, 1000, 1000)
    env = {
        **{k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
        "FLUFFY_HOME": str(base / "home"),
        "FLUFFY_KERNEL_IMAGE": kernel_image,
    }
    return project, env


def call(tool: str, **args: Any) -> dict[str, Any]:
    return {"tool": tool, "args": args}


class Session:
    """One session of the kernel, driven as the CLI does (session.message, session.events)."""

    def __init__(self, client: Any, mode: str = "strict") -> None:
        self.client = client
        self.id = client.call("session.create")["session_id"]
        if mode != "strict":
            client.call("session.set_mode", {"session_id": self.id, "mode": mode})
        self.after = client.call("session.events", {"session_id": self.id, "after": -1})["next"]
        self.events: list[dict[str, Any]] = []

    def start(self, text: str, turns: list[dict[str, Any]], *, auto_approve: bool) -> None:
        self.client.call(
            "session.message",
            {"session_id": self.id, "text": text, "auto_approve": auto_approve,
             "provider": {"name": "scripted", "turns": turns}},
        )  # fmt: skip

    def until(self, kind: str, timeout_s: float = 420) -> dict[str, Any]:
        """The next event of ``kind`` (a review or an exemption waiting, or the turn's end)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            page = self.client.call(
                "session.events", {"session_id": self.id, "after": self.after, "wait_ms": 5000}
            )
            for event in page["events"]:
                self.after = event["seq"]
                self.events.append(event)
                if event["type"] == kind:
                    return dict(event)
                assert event["type"] != "turn_end", f"the turn ended before a {kind}: {event}"
        raise AssertionError(f"no {kind} within {timeout_s} s: {self.events[-8:]}")

    def state(self) -> str:
        return str(self.client.call("session.get", {"session_id": self.id})["state"])
