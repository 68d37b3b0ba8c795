"""A project's own test command runs only after the person's yes on this machine.

`fluffy config tests approve` shows the command and records the yes where the kernel
reads it; starting a kernel asks at a terminal, and `--yes` does not answer for it."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from fluffy.cli import lifecycle, testcommand
from fluffy.cli.main import EXIT_ERROR, EXIT_OK, main
from fluffy.kernel.project.testcmd import approved, load_test_command

pytestmark = pytest.mark.unit

COMMAND = "tests:\n  command: [sh, -c, 'echo \"<testsuite/>\" > {junit}']\n"


@pytest.fixture()
def project(tmp_path: Path, fluffy_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cloned"
    (root / ".fluffy").mkdir(parents=True)
    (root / ".fluffy" / "config.yaml").write_text(COMMAND)
    monkeypatch.chdir(root)
    return root


def _digest(project: Path) -> str:
    command = load_test_command(project)
    assert command is not None
    return command.digest()


def test_approve_shows_the_command_asks_and_records_the_yes(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = testcommand.state_of(project)
    asked: list[str] = []
    monkeypatch.setattr("fluffy.cli.connect.ask", lambda q: asked.append(q) or False)
    assert main(["config", "tests", "approve"]) == 1
    assert asked and "sh -c 'echo" in asked[0] and "counts as green" in asked[0]
    assert _digest(project) not in approved(state)  # no: nothing recorded
    monkeypatch.setattr("fluffy.cli.connect.ask", lambda q: True)
    assert main(["config", "tests", "approve"]) == EXIT_OK
    assert approved(state) == {_digest(project)}
    assert "is approved" in capsys.readouterr().out
    assert main(["config", "tests", "approve", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["approved"] is True  # already: no question
    (project / ".fluffy" / "config.yaml").write_text(COMMAND.replace("echo", "printf"))
    assert testcommand.unapproved(project, state) is not None  # changed: asked again


def test_an_approval_is_readable_by_the_kernels_user_under_any_umask(project: Path) -> None:
    """`fluffy start` may record the yes (as root) after the bootstrap handed the state
    folder to the kernel's user: the record is readable by others whatever the umask."""
    from fluffy.kernel.project.testcmd import approve

    command = load_test_command(project)
    assert command is not None
    state = testcommand.state_of(project)
    old = os.umask(0o077)
    try:
        approve(state, command)
    finally:
        os.umask(old)
    record = state / "approved-test-commands.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o644
    assert approved(state) == {_digest(project)}


def test_approve_without_a_terminal_needs_yes(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = testcommand.state_of(project)
    assert main(["config", "tests", "approve"]) == 1  # pytest's stdin is no terminal
    assert "Not approved" in capsys.readouterr().out and not approved(state)
    assert main(["config", "tests", "approve", "--yes"]) == EXIT_OK
    assert approved(state) == {_digest(project)}


def test_approve_in_a_project_without_a_command_says_there_is_nothing_to_approve(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / ".fluffy" / "config.yaml").write_text("tests:\n  env: {TZ: UTC}\n")
    assert main(["config", "tests", "approve", "--yes"]) == EXIT_ERROR
    assert "names no test command" in capsys.readouterr().err


def test_starting_a_kernel_asks_at_the_terminal_and_yes_does_not_answer(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fluffy start --yes` approves start-up's network questions, never the command:
    the question goes to the terminal, whose no (or absence) leaves it unapproved.  It
    is asked while the kernel's container starts (the kernel reads the approval at each
    test run): after the launch, before start-up's network questions."""
    asked: list[str] = []
    events: list[str] = []

    class Launched(Exception):
        pass

    class Bootstrap:
        def terminate(self) -> None:
            events.append("stopped")

    def launch(*_: object, **__: object) -> Bootstrap:
        events.append("launched")
        return Bootstrap()

    def network_questions(*_: object, **__: object) -> None:
        events.append("network")
        raise Launched

    def ask(answer: bool) -> Callable[[str], bool]:
        def asking(question: str) -> bool:
            asked.append(question)
            events.append("asked")
            return answer

        return asking

    monkeypatch.setattr(lifecycle, "_ask", ask(False))
    monkeypatch.setattr("fluffy.host.engine.engine_access_problem", lambda: None)
    monkeypatch.setattr(lifecycle.subprocess, "Popen", launch)
    monkeypatch.setattr(lifecycle, "write_network_allowlist", network_questions)
    monkeypatch.setattr(lifecycle, "socket_path_problem", lambda _: None)  # pytest's deep tmp
    with pytest.raises(Launched):
        lifecycle.start_kernel(str(project), yes=True)
    assert events == ["launched", "asked", "network", "stopped"]
    state = testcommand.state_of(project)
    assert len(asked) == 1 and "Let fluffy run it?" in asked[0]
    assert not approved(state)
    assert "not approved: test.run will not run it" in capsys.readouterr().out
    monkeypatch.setattr(lifecycle, "_ask", ask(True))
    with pytest.raises(Launched):
        lifecycle.start_kernel(str(project))
    assert approved(state) == {_digest(project)}
    with pytest.raises(Launched):
        lifecycle.start_kernel(str(project))  # approved: no question
    assert len(asked) == 2


def test_the_question_cannot_be_redrawn_by_the_file(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Escape sequences and carriage returns in the command would clear the line and
    print a harmless-looking command in its place: they are shown as codes."""
    (project / ".fluffy" / "config.yaml").write_text(
        'tests:\n  command: [sh, -c, "echo \\e[2K\\rpython -m pytest"]\n'
        '  env: {X: "\\e]0;title\\a"}\n'
    )
    asked: list[str] = []
    monkeypatch.setattr("fluffy.cli.connect.ask", lambda q: asked.append(q) or False)
    main(["config", "tests", "approve"])
    assert asked and all(c.isprintable() for c in asked[0])
    assert "\\x{1b}[2K\\x{d}python -m pytest" in asked[0] and "\\x{7}" in asked[0]


def test_secrets_shows_what_tests_do_not_see_and_records_the_persons_allowance(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fluffy.kernel.project.testsecrets import allowed_secrets

    (project / ".env").write_text("TOKEN=hunter2\n")  # no repository: nothing is tracked
    assert main(["config", "tests", "secrets"]) == EXIT_OK
    out = capsys.readouterr().out
    assert ".env" in out and "--allow PATH" in out and "hunter2" not in out
    assert main(["config", "tests", "secrets", "--allow", str(project / ".env"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["kept_out"] == [] and shown["allowed_present"] == [".env"]
    assert allowed_secrets(testcommand.state_of(project)) == {".env"}
    assert main(["config", "tests", "secrets", "--forget", ".env", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["kept_out"] == [".env"]


def test_secrets_json_names_a_file_that_is_not_utf8_as_git_quotes_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON cannot carry the name's own bytes (a lone surrogate is not text a strict
    parser takes): it carries the quoted form the text output shows, one-to-one."""
    name = os.fsdecode(b"caf\xe9.env")
    (project / name).write_text("TOKEN=hunter2\n")
    assert main(["config", "tests", "secrets", "--json"]) == EXIT_OK
    raw = capsys.readouterr().out
    assert "\\udc" not in raw and json.loads(raw)["kept_out"] == ['"caf\\351.env"']
    assert main(["config", "tests", "secrets", "--allow", name, "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["allowed"] == shown["allowed_present"] == ['"caf\\351.env"']


@pytest.mark.parametrize("outside", ["..", "../other/.env", "/etc/passwd", "."])
def test_secrets_refuses_a_path_outside_the_project(
    project: Path, outside: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "tests", "secrets", "--allow", outside]) == EXIT_ERROR
    assert "not a file inside" in capsys.readouterr().err


def test_a_project_whose_path_is_not_utf8_gets_a_clear_error(
    tmp_path: Path,
    fluffy_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # an old Latin-1 folder: every path fluffy derives from it would fail to encode
    folder = tmp_path / os.fsdecode(b"caf\xe9")
    folder.mkdir()
    monkeypatch.chdir(folder)
    assert main(["config", "tests", "secrets", "--json"]) == EXIT_ERROR
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "config.invalid" and "is not UTF-8 text" in error["what"]
    assert "caf\\udce9" in error["what"] and "Rename the folder" in error["fix"]
