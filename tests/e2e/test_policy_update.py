"""Meta-policy through a real kernel: tried on audited decisions, reviewed, atomic, audited."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from fluffy.errors import ModeDenied, PolicyError
from fluffy.ipc.client import SyncClient

from .test_workflow_ipc import DEMO, FLUFFY, _serve, _stop, audit_entries

ALLOW_EXPLORE = """capabilities:
  - name: explore-ok
    match: {syscall: session.set_mode, session_mode: [explore]}
    action: allow
"""
NO_EXPLORE = "capabilities: []\n"


def test_policy_update_is_tried_on_the_audit_log_then_applied(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(DEMO, project)
    (project / ".fluffy").mkdir(exist_ok=True)
    policy_file = project / ".fluffy" / "policy.yaml"
    policy_file.write_text(ALLOW_EXPLORE)
    proc, sock = _serve(tmp_path, project)
    try:
        with SyncClient(str(sock), timeout=20) as client:
            sid = client.call("session.create")["session_id"]
            for _ in range(2):
                client.call("session.set_mode", {"session_id": sid, "mode": "explore"})
                client.call("session.set_mode", {"session_id": sid, "mode": "strict"})
            # invalid: refused with file, line and field; nothing written
            with pytest.raises(PolicyError) as bad:
                client.call("policy.update", {"text": "capabilities:\n  - name: x\n    act: 1\n"})
            assert "policy.yaml:2" in bad.value.what
            assert policy_file.read_text() == ALLOW_EXPLORE
            plan = client.call("policy.update", {"text": NO_EXPLORE})
            assert plan["applied"] is False and plan["breaking"] >= 2
            assert any(
                line.startswith("[BREAKING] session.set_mode") for line in plan["changes"]
            ), plan
            assert policy_file.read_text() == ALLOW_EXPLORE  # a plan writes nothing
        cli = _edit(sock, _write(tmp_path / "new.yaml", NO_EXPLORE), "--yes", "--json")
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert json.loads(cli.stdout)["applied"] is True
        assert policy_file.read_text() == NO_EXPLORE
        with SyncClient(str(sock), timeout=20) as client, pytest.raises(ModeDenied):
            client.call("session.set_mode", {"session_id": sid, "mode": "explore"})
    finally:
        _stop(proc)
    updates = audit_entries(tmp_path / "state", "policy_update")
    assert len(updates) == 1 and updates[0]["metadata"]["breaking"] != "0"


def test_edit_without_confirmation_applies_nothing(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(DEMO, project)
    (project / ".fluffy").mkdir(exist_ok=True)
    (project / ".fluffy" / "policy.yaml").write_text(ALLOW_EXPLORE)
    proc, sock = _serve(tmp_path, project)
    try:
        cli = _edit(sock, _write(tmp_path / "new.yaml", NO_EXPLORE))
        assert cli.returncode == 1 and "Nothing applied" in cli.stdout
        assert (project / ".fluffy" / "policy.yaml").read_text() == ALLOW_EXPLORE
    finally:
        _stop(proc)


def _edit(sock: Path, new: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`fluffy config policy edit --socket S --file NEW [extra]`, no terminal."""
    return subprocess.run(
        [FLUFFY, "config", "policy", "edit", "--socket", str(sock), "--file", str(new), *extra],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
