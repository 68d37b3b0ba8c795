"""The workflow's syscalls through a real `fluffy kernel serve`: policy-checked and audited."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import ExemptionDenied, InvalidPayload, ModeDenied
from fluffy.ipc.client import SyncClient

from .test_kernel_serve import _wait_for

FLUFFY = str(Path(sys.executable).parent / "fluffy")
DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-project"


def _serve(tmp_path: Path, project: Path) -> tuple[subprocess.Popen[str], Path]:
    sock = tmp_path / "run" / "kernel.sock"
    proc = subprocess.Popen(
        [
            FLUFFY,
            "kernel",
            "serve",
            "--socket",
            str(sock),
            "--state-dir",
            str(tmp_path / "state"),
            "--project",
            str(project),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for(sock, proc)
    return proc, sock


def audit_entries(state: Path, event_type: str) -> list[dict[str, Any]]:
    """`fluffy audit log --type T --json` of a state folder."""
    out = subprocess.run(
        [FLUFFY, "audit", "log", "--state-dir", str(state), "--type", event_type, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return list(json.loads(out.stdout)["entries"])


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err


@pytest.mark.parametrize("allow_explore", [False, True])
def test_session_syscalls_are_policy_checked_and_audited(
    tmp_path: Path, allow_explore: bool
) -> None:
    project = tmp_path / "project"
    shutil.copytree(DEMO, project)
    if allow_explore:
        (project / ".fluffy").mkdir(exist_ok=True)
        (project / ".fluffy" / "policy.yaml").write_text(
            "capabilities:\n  - name: explore-ok\n"
            "    match: {syscall: session.set_mode, session_mode: [explore]}\n"
            "    action: allow\n"
        )
    else:  # a policy without the demo's rule letting the person switch modes
        policy = project / ".fluffy" / "policy.yaml"
        text = policy.read_text()
        start = text.index("  - name: person-switches-modes")
        policy.write_text(text[:start] + text[text.index("  - name: explore-writes") :])
    proc, sock = _serve(tmp_path, project)
    try:
        with SyncClient(str(sock), timeout=10) as client:
            session = client.call("session.create")
            assert (session["state"], session["mode"]) == ("idle", "strict")
            sid = session["session_id"]
            if allow_explore:
                assert (
                    client.call("session.set_mode", {"session_id": sid, "mode": "explore"})["mode"]
                    == "explore"
                )
                client.call("session.set_mode", {"session_id": sid, "mode": "strict"})
            else:
                with pytest.raises(ModeDenied):
                    client.call("session.set_mode", {"session_id": sid, "mode": "explore"})
            assert client.call("session.get", {"session_id": sid})["mode"] == "strict"
            with pytest.raises(InvalidPayload):
                client.call("session.set_mode", {"session_id": sid})
            with pytest.raises(ExemptionDenied):  # not in planning
                client.call(
                    "workflow.request_exemption",
                    {
                        "session_id": sid,
                        "category": "documentation",
                        "paths": ["README.md"],
                        "reason": "docs",
                    },
                )
            history = client.call("session.history", {"session_id": sid})
            assert history[0]["event"] == "session_created"
            assert [h["event"] for h in history].count("set_mode") == (2 if allow_explore else 1)
            head = client.call("kernel.ping")["audit_head"]
            assert head["seq"] > 1 and len(head["hash"]) == 64
    finally:
        _stop(proc)
    calls = audit_entries(tmp_path / "state", "syscall")
    assert list((tmp_path / "state" / "backups").glob("fluffy-*.db"))  # taken at shutdown
    methods = [c["syscall_type"] for c in calls]
    assert "kernel.ping" not in methods
    assert methods.count("session.set_mode") == (3 if allow_explore else 2)
    decisions = {c["policy_decision"] for c in calls if c["syscall_type"] == "session.set_mode"}
    assert decisions == ({"allowed", "denied"} if allow_explore else {"denied"})
    verified = subprocess.run(
        [FLUFFY, "audit", "verify", "--state-dir", str(tmp_path / "state"), "--json"],
        capture_output=True,
        text=True,
    )
    assert verified.returncode == 0, verified.stdout
    assert json.loads(verified.stdout)["ok"] is True
