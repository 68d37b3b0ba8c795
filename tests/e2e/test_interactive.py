"""`fluffy` with no arguments: the kernel brought up in the foreground, joined, left."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from fluffy.cli.interactive import handle
from fluffy.ipc.client import SyncClient
from tests.e2e.project_kernel import user_project

from .test_workflow_ipc import DEMO, _serve, _stop

FLUFFY = str(Path(sys.executable).parent / "fluffy")


def test_prompt_commands_talk_to_the_kernel(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(DEMO, project)
    policy = project / ".fluffy" / "policy.yaml"  # a policy written before modes were
    text = policy.read_text()  # the person's to switch: it refuses, naming the rule
    start = text.index("  - name: person-switches-modes")
    policy.write_text(text[:start] + text[text.index("  - name: explore-writes") :])
    proc, sock = _serve(tmp_path, project)
    status: dict[str, Any] = {"health": "healthy", "runtime": "docker", "container_id": "c" * 12}
    try:
        with SyncClient(str(sock), timeout=20) as client:
            sid = client.call("session.create")["session_id"]
            shown = handle("/status", client, sid, status).text
            assert f"session {sid}: mode strict, state idle" in shown
            refused = handle("/explore", client, sid, status).text
            assert "Fix:" in refused and "caller_tag: [person]" in refused
            assert client.call("session.get", {"session_id": sid})["mode"] == "strict"
            assert handle("/strict", client, sid, status).text == "mode strict, state idle"
            assert "/quit" in handle("/help", client, sid, status).text
            assert "unknown command /nope" in handle("/nope x", client, sid, status).text
            assert "nothing was sent" in handle("add a feature", client, sid, status).text
            assert client.call("session.get", {"session_id": sid})["state"] == "idle"
            assert handle("/quit", client, sid, status).quit
    finally:
        _stop(proc)


def test_fluffy_brings_the_kernel_up_in_the_foreground_and_stops_it(
    engine: object, images: dict[str, str], tmp_path: Path
) -> None:
    project, env = user_project(tmp_path, images["kernel"], repository=False)
    out = subprocess.run(
        [FLUFFY], cwd=project, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kernel healthy" in out.stdout and "mode strict, state idle" in out.stdout
    assert "leaving stops it" in out.stdout
    # it was this fluffy's kernel: gone with it
    status = subprocess.run(
        [FLUFFY, "status", "--json", "--project", str(project)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode != 0
    # a kernel started with `fluffy start` is joined and left running
    started = subprocess.run(
        [FLUFFY, "start", "--project", str(project), "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        again = subprocess.run(
            [FLUFFY], cwd=project, env=env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert again.returncode == 0 and "leaving stops it" not in again.stdout
        still = subprocess.run(
            [FLUFFY, "status", "--json", "--project", str(project)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert json.loads(still.stdout)["reachable"] is True
    finally:
        subprocess.run(
            [FLUFFY, "stop", "--project", str(project)], env=env, capture_output=True, timeout=120
        )


def test_modes_switch_by_slash_command_on_a_fresh_repository(tmp_path: Path) -> None:
    """No .fluffy/: fluffy's default policy lets the person switch modes (issue 33)."""
    project = tmp_path / "fresh"
    shutil.copytree(DEMO, project, ignore=shutil.ignore_patterns(".fluffy"))
    proc, sock = _serve(tmp_path, project)
    status: dict[str, Any] = {"health": "healthy", "runtime": "docker", "container_id": "c" * 12}
    try:
        with SyncClient(str(sock), timeout=20) as client:
            sid = client.call("session.create")["session_id"]
            assert handle("/explore", client, sid, status).text == "mode explore, state idle"
            assert client.call("session.get", {"session_id": sid})["mode"] == "explore"
            assert handle("/strict", client, sid, status).text == "mode strict, state idle"
    finally:
        _stop(proc)
