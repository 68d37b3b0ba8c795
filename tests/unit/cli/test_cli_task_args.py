"""`fluffy "task"` vs `fluffy COMMAND`: argv dispatch, and one task against a stand-in kernel."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fluffy.cli import connect, interactive, task
from fluffy.cli.connect import Attached
from fluffy.cli.main import EXIT_ERROR, EXIT_FAILED, EXIT_OK, main, parse
from unit.cli_fakes import REVIEW, FakeKernel, turn

pytestmark = pytest.mark.unit


def test_a_quoted_task_goes_to_the_task_parser() -> None:
    args = parse(["add x", "--yes"])
    assert args.func is task.run_task
    assert args.task == "add x" and args.yes and args.mode is None


def test_subcommands_stay_subcommands() -> None:
    args = parse(["status"])
    assert args.command == "status" and not hasattr(args, "task")
    assert parse(["session", "list", "--json"]).func.__name__ == "cmd_session_list"
    assert parse(["plugin", "list"]).command == "plugin"


def test_options_alone_open_the_prompt_in_that_mode() -> None:
    args = parse(["--mode", "explore"])
    assert args.func is task.run_task and args.task is None and args.mode == "explore"
    assert getattr(parse([]), "func", None) is None  # bare `fluffy`: the prompt


@pytest.mark.parametrize(
    "argv",
    [["stauts"], ["--json"], ["x y", "--provider", "openai", "--script", "s.yaml"], ["  "]],
)
def test_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    if argv == ["stauts"]:
        assert "did you mean `fluffy status`" in capsys.readouterr().err


def test_fluffy_mode_explore_runs_the_prompt_with_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    def fake_run(project: str, **kwargs: Any) -> int:
        seen.update(kwargs, project=project)
        return 0

    monkeypatch.setattr(interactive, "run", fake_run)
    assert main(["--mode", "explore", "--project", str(tmp_path)]) == EXIT_OK
    assert seen["project"] == str(tmp_path.resolve())
    assert seen["cli"] == {"mode": "explore"} and seen["session_id"] is None


# -- one task against the stand-in kernel --------------------------------------------------
@pytest.fixture()
def kernel(monkeypatch: pytest.MonkeyPatch, fluffy_home: Path) -> FakeKernel:
    fake = FakeKernel()

    @contextmanager
    def attached(project: str, *, say: Any, yes: bool = False) -> Iterator[Attached]:
        fake.approved_start = yes  # what start-up's questions would have been answered
        yield Attached(project, {"health": "healthy"}, fake, owned=False)

    monkeypatch.setattr(task, "attached", attached)
    for name in ("FLUFFY_PROVIDER", "FLUFFY_MODE", "FLUFFY_MODEL", "FLUFFY_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return fake


def _run(tmp_path: Path, *argv: str) -> int:
    extra: list[str] = []
    if "--script" not in argv and "--provider" not in argv:  # offline needs a script
        script = tmp_path / "default-script.yaml"
        script.write_text("task: t\nturns:\n  - say: hi\n    calls: []\n")
        extra = ["--script", str(script)]
    return main([*argv, *extra, "--project", str(tmp_path)])


def test_the_scripted_provider_without_a_script_is_refused_with_a_fix(
    kernel: FakeKernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "FLUFFY_API_KEY", "FLUFFY_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["add x", "--project", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "no AI provider is set up" in err and "OPENAI_API_KEY" in err
    assert not kernel.methods("session.message")  # nothing was sent


def test_an_api_key_in_the_environment_picks_its_provider(
    kernel: FakeKernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-" + "k" * 20)
    kernel.pages = [turn("add x")]
    assert main(["add x", "--project", str(tmp_path)]) == EXIT_OK
    (sent,) = kernel.methods("session.message")
    assert sent["provider"]["name"] == "openai" and sent["provider"]["model"] == "gpt-4o-mini"
    assert sent["provider"]["api_key"].startswith("sk-test-")  # only to the kernel's socket


def test_a_task_runs_to_done(
    kernel: FakeKernel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel.pages = [turn("add x", {"type": "text_delta", "content": "ok"})]
    assert _run(tmp_path, "add x") == EXIT_OK
    out = capsys.readouterr().out
    assert "You: add x" in out and "AI: ok" in out and "Done." in out
    assert "No change was made. (session s1)" in out  # one line: what landed
    assert "[strict] [idle] >" not in out  # nothing that looks like a prompt after the end
    sent = kernel.methods("session.message")
    assert len(sent) == 1 and sent[0]["text"] == "add x" and sent[0]["auto_approve"] is False
    assert sent[0]["provider"]["name"] == "scripted" and sent[0]["max_rounds"] >= 1
    assert not kernel.methods("session.set_mode")  # strict is the new session's mode


def test_script_and_yes_reach_the_kernel(
    kernel: FakeKernel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "s.yaml"
    script.write_text("task: t\nturns:\n  - say: hello\n    calls: []\n")
    kernel.pages = [turn("t", {**REVIEW, "kernel_decides": True})]  # as with auto_approve
    assert _run(tmp_path, "t", "--yes", "--script", str(script)) == EXIT_OK
    sent = kernel.methods("session.message")[0]
    assert sent["auto_approve"] is True
    assert sent["provider"]["turns"] == [
        {"say": "hello", "calls": []},
        {"say": "Done.", "calls": []},
    ]
    assert not kernel.methods("review.approve")  # with --yes the kernel decides


def test_json_mode_prints_only_events(
    kernel: FakeKernel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel.pages = [turn("add x")]
    assert _run(tmp_path, "add x", "--json") == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["type"] for e in events] == ["turn_start", "turn_end", "summary"]
    assert events[-1]["landed"] is True and events[-1]["text"] == "No change was made."


def test_a_failed_turn_exits_1(kernel: FakeKernel, tmp_path: Path) -> None:
    kernel.pages = [turn("add x", status="failed")]
    assert _run(tmp_path, "add x") == EXIT_FAILED


def test_without_a_terminal_a_review_is_left_waiting(
    kernel: FakeKernel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel.pages = [turn("add x", REVIEW)]
    assert _run(tmp_path, "add x") == EXIT_FAILED
    out = capsys.readouterr().out
    assert "Review needed" in out and "then /approve or /reject" in out
    assert kernel.blocked and not kernel.methods("review.approve")


@pytest.mark.parametrize(("answer", "code"), [(True, EXIT_OK), (False, EXIT_FAILED)])
def test_on_a_terminal_the_review_is_asked(
    kernel: FakeKernel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    answer: bool,
    code: int,
) -> None:
    questions: list[str] = []

    def ask(question: str) -> bool:
        questions.append(question)
        return answer

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(task, "ask", ask)
    kernel.pages = [[*turn("add x")[:1], REVIEW], turn("add x")[-1:]]
    assert _run(tmp_path, "add x") == code
    assert questions == ["Approve?"]
    decided = "review.approve" if answer else "review.reject"
    assert kernel.methods(decided) == [{"session_id": "s1", "plan_id": "plan-1"}]


def test_debug_without_terminal_or_yes_is_refused(
    kernel: FakeKernel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(tmp_path, "add x", "--mode", "debug") == EXIT_ERROR
    err = capsys.readouterr().err
    assert "ERROR: debug mode needs your approval" in err and "Fix:" in err and "--yes" in err
    assert not kernel.calls  # refused before the kernel was asked anything


def test_the_prompt_in_debug_mode_without_terminal_is_refused_before_starting(
    monkeypatch: pytest.MonkeyPatch, fluffy_home: Path, tmp_path: Path
) -> None:
    def no_kernel(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the kernel must not be started")

    monkeypatch.setattr(connect, "attached", no_kernel)
    assert main(["--mode", "debug", "--project", str(tmp_path)]) == EXIT_ERROR


def test_debug_with_yes_is_approved(kernel: FakeKernel, tmp_path: Path) -> None:
    kernel.pages = [turn("add x")]
    assert _run(tmp_path, "add x", "--mode", "debug", "--yes") == EXIT_OK
    assert kernel.methods("session.set_mode") == [
        {"session_id": "s1", "mode": "debug", "approved": True}
    ]


def test_resuming_keeps_the_mode_unless_asked(kernel: FakeKernel, tmp_path: Path) -> None:
    sid = kernel.call("session.create")["session_id"]
    kernel.call("session.set_mode", {"session_id": sid, "mode": "explore"})
    kernel.calls.clear()
    kernel.pages = [turn("more")]
    assert _run(tmp_path, "more", "--session", sid) == EXIT_OK
    assert not kernel.methods("session.create") and not kernel.methods("session.set_mode")
    assert kernel.methods("session.message")[0]["session_id"] == sid


def test_an_unknown_session_is_a_fluffy_error(
    kernel: FakeKernel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(tmp_path, "x y", "--session", "nope") == EXIT_ERROR
    assert "fluffy session list" in capsys.readouterr().err


def test_on_a_terminal_an_explore_review_offers_tests_first(
    kernel: FakeKernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    questions: list[str] = []

    def ask(question: str) -> bool:
        questions.append(question)
        return question.startswith("Add tests")  # no to merging, yes to tests first

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(task, "ask", ask)
    review = {**REVIEW, "can_add_tests": True}
    kernel.pages = [[*turn("add x")[:1], review], turn("add x")[-1:]]
    assert _run(tmp_path, "add x") == EXIT_OK  # tests first is not a rejection
    assert questions == ["Approve?", "Add tests first, keeping the change?"]
    assert kernel.methods("review.add_tests") == [{"session_id": "s1", "plan_id": "plan-1"}]
    assert not kernel.methods("review.reject")


@pytest.mark.parametrize("answer", [True, False])
def test_on_a_terminal_the_ais_exemption_is_asked_even_with_yes(
    kernel: FakeKernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: bool
) -> None:
    from unit.cli_fakes import EXEMPTION

    questions: list[str] = []

    def ask(question: str) -> bool:
        questions.append(question)
        return answer

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(task, "ask", ask)
    kernel.pages = [[*turn("fix docs")[:1], EXEMPTION], turn("fix docs")[-1:]]
    assert _run(tmp_path, "fix docs", "--yes") == EXIT_OK
    assert questions == [
        "Grant the TDD exemption documentation for README.md (reason: a typo; "
        "request ex-0123456789abcdef)?"
    ]
    assert kernel.methods("workflow.decide_exemption") == [
        {"session_id": "s1", "grant": answer, "request_id": "ex-0123456789abcdef"}
    ]


def test_a_task_s_yes_also_answers_start_up_s_questions(tmp_path: Path, kernel: FakeKernel) -> None:
    # a network entry new in policy.yaml is approved by --yes when the task starts the
    # kernel (fluffy.cli.lifecycle.approver); without it only a terminal can say yes
    kernel.pages = [turn("t")]
    assert _run(tmp_path, "a task") == 0
    assert kernel.approved_start is False  # type: ignore[attr-defined]
    kernel.pages = [turn("t")]
    assert _run(tmp_path, "a task", "--yes") == 0
    assert kernel.approved_start is True  # type: ignore[attr-defined]
