"""`fluffy doctor` and the CLI edge, with no engine reachable (unit level)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fluffy.cli.main import EXIT_ERROR, EXIT_FAILED, EXIT_USAGE, main
from fluffy.doctor import check_dependencies, check_state_dir, run_doctor


@pytest.fixture()
def no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLUFFY_RUNTIME", "docker")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/stopped.sock")


def test_doctor_fails_with_a_fix_when_no_engine_answers(
    no_engine: None, fluffy_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor"]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert "FAIL engine" in out and "fix:" in out
    assert "apt install docker.io" in out or "systemctl start docker" in out


def test_doctor_json_is_one_valid_object(
    no_engine: None, fluffy_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--json"]) == EXIT_FAILED
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["engine"] is None
    engine = next(c for c in report["checks"] if c["name"] == "engine")
    assert engine["status"] == "fail" and engine["fix"]
    assert {c["name"] for c in report["checks"]} >= {"python", "dependencies", "state_dir"}


def test_state_dir_that_cannot_be_written_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("FLUFFY_HOME", str(blocker))  # a file, so state/ cannot be made
    check = check_state_dir()
    assert check.status == "fail" and "FLUFFY_HOME" in check.fix


def test_dependencies_are_reported_with_versions() -> None:
    check = check_dependencies()
    assert check.status == "ok"
    assert {"pydantic", "msgspec", "docker", "podman"} <= set(check.data["versions"])


def test_report_ok_only_without_failures(no_engine: None, fluffy_home: Path) -> None:
    report = run_doctor()
    assert not report.ok
    assert report.as_dict()["fluffy_version"]


def test_engine_commands_render_what_why_fix(
    no_engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["images", "list"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "ERROR:" in err and "Reason:" in err and "Fix:" in err and "engine.unavailable" in err


def test_engine_commands_with_json_print_the_error_as_json(
    no_engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--json"]) == EXIT_ERROR
    data = json.loads(capsys.readouterr().out)
    assert data["error"]["code"] == "engine.unavailable" and data["error"]["fix"]


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and EXIT_USAGE == 2
    assert "doctor" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("fluffy 0.")
