"""`fluffy exemption request|grant|refuse`: a running kernel's session, or a clear error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fluffy.cli import exemption
from fluffy.cli.main import main
from unit.cli_fakes import EXEMPTION, FakeKernel

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


ASKED = "documentation for README.md (reason: a typo; request ex-0123456789abcdef)"


@pytest.mark.parametrize(
    ("argv", "grant"),
    [(["grant", "--id", "ex-0123456789abcdef"], True), (["refuse", "--reason", "no"], False)],
)
def test_grant_and_refuse_answer_the_ais_request_by_its_id(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    grant: bool,
) -> None:
    kernel = FakeKernel()
    sid = kernel.call("session.create")["session_id"]
    kernel.exemption = dict(EXEMPTION)
    _attach(monkeypatch, kernel)
    assert main(["exemption", *argv, "--project", str(tmp_path)]) == 0
    decided = {"session_id": sid, "grant": grant, "request_id": "ex-0123456789abcdef"}
    assert kernel.methods("workflow.decide_exemption") == [
        {**decided, **({} if grant else {"reason": "no"})}
    ]
    assert (kernel.sessions[sid]["state"] == "exploring") is grant
    out = capsys.readouterr().out
    assert ("exemption granted: documentation for README.md" if grant else ASKED) in out


def test_a_grant_without_id_off_a_terminal_shows_the_request_and_grants_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel = FakeKernel()
    kernel.call("session.create")
    kernel.exemption = dict(EXEMPTION)
    _attach(monkeypatch, kernel)
    monkeypatch.setattr(exemption.sys.stdin, "isatty", lambda: False, raising=False)
    assert main(["exemption", "grant", "--project", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "not granted: name the request you grant with --id" in err
    assert f"the AI asks for {ASKED}" in err
    assert "fluffy exemption grant --id ex-0123456789abcdef" in err
    assert not kernel.methods("workflow.decide_exemption")


@pytest.mark.parametrize("answer", [True, False])
def test_a_grant_without_id_on_a_terminal_asks_after_showing_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    answer: bool,
) -> None:  # fmt: skip
    kernel = FakeKernel()
    sid = kernel.call("session.create")["session_id"]
    kernel.exemption = dict(EXEMPTION)
    _attach(monkeypatch, kernel)
    monkeypatch.setattr(exemption.sys.stdin, "isatty", lambda: True, raising=False)
    questions: list[str] = []
    monkeypatch.setattr(exemption, "ask", lambda q: questions.append(q) or answer)
    assert main(["exemption", "grant", "--project", str(tmp_path)]) == (0 if answer else 1)
    assert f"The AI asks for a TDD exemption: {ASKED}" in capsys.readouterr().out
    assert questions == ["Grant this TDD exemption?"]
    expected = [{"session_id": sid, "grant": True, "request_id": "ex-0123456789abcdef"}]
    assert kernel.methods("workflow.decide_exemption") == (expected if answer else [])


def test_a_grant_naming_another_request_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel = FakeKernel()
    sid = kernel.call("session.create")["session_id"]
    kernel.exemption = dict(EXEMPTION)
    _attach(monkeypatch, kernel)
    assert main(["exemption", "grant", "--id", "ex-seen", "--project", str(tmp_path)]) == 3
    assert "(workflow.exemption_mismatch)" in capsys.readouterr().err
    assert kernel.sessions[sid]["state"] != "exploring" and kernel.exemption is not None


def test_deciding_with_nothing_pending_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel = FakeKernel()
    kernel.call("session.create")
    _attach(monkeypatch, kernel)
    assert main(["exemption", "refuse", "--project", str(tmp_path)]) == 3
    assert "no exemption request waits for your decision" in capsys.readouterr().err
    assert not kernel.methods("workflow.decide_exemption")


def test_parse_exempt() -> None:
    assert exemption.parse_exempt("documentation a.md b.md -- why not") == (
        "documentation",
        ["a.md", "b.md"],
        "why not",
    )
    assert exemption.parse_exempt("documentation a.md") is None
    assert exemption.parse_exempt("documentation -- why") is None
    assert exemption.parse_exempt("documentation a.md --  ") is None
