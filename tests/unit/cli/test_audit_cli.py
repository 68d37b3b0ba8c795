"""`fluffy audit verify|log` find the log of the project named (--project, default: the
current folder), say when there is none, and never call an empty log verified."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fluffy.bootstrap.supervisor import paths
from fluffy.cli.main import main
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog

pytestmark = pytest.mark.unit


def _kernel_ran(state: Path, entries: int) -> None:
    async def body() -> None:
        audit = await AuditLog.open(state)
        for n in range(entries):
            await audit.record(Event("kernel_start" if n == 0 else "policy_update"))
        await audit.close()

    asyncio.run(body())


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # a folder no kernel ever ran for
    return tmp_path / "home"


def test_verify_and_log_take_the_project_they_read(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    _kernel_ran(paths(home, str(project.resolve()))["state"], 3)
    assert main(["audit", "verify", "--project", str(project), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["entries"] == 3
    assert main(["audit", "log", "--project", str(project), "--json"]) == 0
    assert "policy_update" in capsys.readouterr().out


def test_a_folder_without_a_log_is_told_so(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "verify"]) == 3
    err = capsys.readouterr().err
    assert "there is no audit log for" in err and "--project DIR" in err
    assert "checked 0 entries" not in err


def test_an_empty_log_is_not_reported_as_verified(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = paths(home, str(tmp_path.resolve()))["state"]
    _kernel_ran(state, 0)  # the database made, nothing recorded yet
    assert main(["audit", "verify"]) == 0
    out = capsys.readouterr().out
    assert "nothing was verified" in out and "intact" not in out
