"""`fluffy exemption request|grant|refuse`: a running kernel's session, or a clear error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fluffy.cli import exemption
from fluffy.cli.main import main

from .cli_fakes import EXEMPTION, FakeKernel

pytestmark = pytest.mark.unit


def test_without_a_running_kernel_it_says_what_why_and_fix(
    tmp_path: Path, fluffy_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["exemption", "request", "--project", str(tmp_path), "--category", "documentation",
            "--path", "README.md", "--reason", "typo"]  # fmt: skip
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert f"no kernel runs for {tmp_path}" in err
    assert "an exemption belongs to a session in progress" in err
    assert "fluffy start --project" in err


def _attach(monkeypatch: pytest.MonkeyPatch, kernel: FakeKernel) -> None:
    @contextmanager
    def running(project: Path) -> Iterator[Any]:
        yield kernel

    monkeypatch.setattr(exemption, "running", running)


def test_request_asks_the_latest_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel = FakeKernel()
    sid = kernel.call("session.create")["session_id"]
    _attach(monkeypatch, kernel)
    argv = ["exemption", "request", "--project", str(tmp_path), "--category", "config_change",
            "--path", "setup.cfg", "--path", "tox.ini", "--reason", "lint settings"]  # fmt: skip
    assert main(argv) == 0
    assert kernel.methods("workflow.request_exemption") == [
        {"session_id": sid, "category": "config_change", "paths": ["setup.cfg", "tox.ini"],
         "reason": "lint settings"}
    ]  # fmt: skip
    assert "exemption granted: config_change for setup.cfg, tox.ini" in capsys.readouterr().out


def test_a_category_outside_the_design_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["exemption", "request", "--category", "tests", "--path", "a", "--reason", "r"])
    assert exited.value.code == 2


@pytest.mark.parametrize(("action", "grant"), [("grant", True), ("refuse", False)])
def test_grant_and_refuse_answer_the_ais_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: str, grant: bool
) -> None:
    kernel = FakeKernel()
    sid = kernel.call("session.create")["session_id"]
    kernel.exemption = dict(EXEMPTION)
    _attach(monkeypatch, kernel)
    assert main(["exemption", action, "--project", str(tmp_path)]) == 0
    assert kernel.methods("workflow.decide_exemption") == [{"session_id": sid, "grant": grant}]
    assert (kernel.sessions[sid]["state"] == "exploring") is grant


def test_parse_exempt() -> None:
    assert exemption.parse_exempt("documentation a.md b.md -- why not") == (
        "documentation",
        ["a.md", "b.md"],
        "why not",
    )
    assert exemption.parse_exempt("documentation a.md") is None
    assert exemption.parse_exempt("documentation -- why") is None
    assert exemption.parse_exempt("documentation a.md --  ") is None
