"""`fluffy "add error handling"`: one task for the AI, start to end, then leave.

The words after `fluffy` are a task unless they name a subcommand (`fluffy status` is
still the status command); a single word that looks like a mistyped subcommand is a
usage error rather than a task sent to the AI.  `fluffy --mode explore` with no task
opens the prompt in that mode.

Exit codes: 0 the task's change landed (merged, and committed where the workflow
commits) or it made none; 1 it did not land (the tests are not green, a review waits,
the commit failed, the turn failed, was cancelled or rejected, the session was
quarantined): one line says which; 3 a fluffy error (ERROR / Reason / Fix).  ``--json``
ends with a ``summary`` event saying the same.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape

from fluffy.cli.connect import (
    apply_mode,
    approve_mode,
    ask,
    ask_call,
    attached,
    get_session,
    git_identity,
    message_options,
    script_turns,
    settings_for,
)
from fluffy.cli.endpoint import allowlist_hint
from fluffy.cli.events import Asked
from fluffy.cli.exemption import request_text
from fluffy.cli.outcome import Tally, outcome
from fluffy.cli.project import env_for_task, show_project
from fluffy.cli.render import stderr, stdout, use_theme
from fluffy.cli.session_view import JsonRenderer, SessionRenderer
from fluffy.cli.turns import cursor, follow
from fluffy.errors import ConfigError
from fluffy.ipc.results.events import ExemptionAsked, ToolCallHeld
from fluffy.safetext import visible

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
PROVIDERS = ("scripted", "openai", "anthropic", "ollama", "lmstudio")
MODES = ("strict", "explore", "debug")
_NOT_TASKS = ("-h", "--help", "--version")


def task_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fluffy",
        description='fluffy "TASK": run one task through the kernel; without TASK, the prompt.',
    )
    parser.add_argument("task", nargs="?", help="what the AI should do (quote it)")
    parser.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="approve reviews, debug mode and network entries new in policy.yaml",
    )
    parser.add_argument(
        "--provider",
        choices=PROVIDERS,
        help="the AI provider (ollama, lmstudio: a local OpenAI-compatible server)",
    )
    parser.add_argument("--base-url", help="the provider's API address")
    parser.add_argument("--model", help="the model name")
    parser.add_argument("--project", help="the project folder (default: the current one)")
    parser.add_argument("--mode", choices=MODES, help="the session's mode")
    parser.add_argument("--session", help="continue this session (default: a new one)")
    parser.add_argument("--json", action="store_true", help="print the events as JSON lines")
    parser.add_argument("--script", help="the scripted provider's YAML (offline, no API key)")
    parser.add_argument(
        "--branch",
        action="store_true",
        default=None,
        help="work on a branch of its own, in a copy of the repository (your checkout is "
        "never written; `fluffy session merge ID` brings it in)",
    )
    return parser


def is_task(argv: Sequence[str], commands: Collection[str]) -> bool:
    """Whether argv is `fluffy [TASK] [OPTIONS]` rather than a subcommand (or --help)."""
    return bool(argv) and argv[0] not in commands and argv[0] not in _NOT_TASKS


def parse(argv: Sequence[str], commands: Collection[str]) -> argparse.Namespace:
    parser = task_parser()
    args = parser.parse_args(list(argv))
    task = args.task
    if task is not None and not task.split():
        parser.error("the task is empty")
    if task is not None and len(task.split()) == 1:
        close = difflib.get_close_matches(task, list(commands), n=1, cutoff=0.75)
        if close:
            parser.error(
                f"{task!r} is not a command (did you mean `fluffy {close[0]}`?); "
                f'a task for the AI is quoted text, e.g. fluffy "add error handling"'
            )
    if task is None and args.json:
        parser.error("--json needs a task (the prompt is for people)")
    if task is None and args.branch:
        parser.error('--branch needs a task (fluffy "TASK" --branch)')
    if args.script and args.provider not in (None, "scripted"):
        parser.error("--script goes with the scripted provider")
    args.func = run_task
    return args


def cli_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The CLI layer of the configuration hierarchy: only what was given."""
    given = {
        "provider": args.provider or ("scripted" if args.script else None),
        "model": args.model,
        "base_url": args.base_url,
        "mode": args.mode,
    }
    return {key: value for key, value in given.items() if value is not None}


def run_task(args: argparse.Namespace) -> int:
    project = Path(args.project or ".").resolve()
    if not project.is_dir():
        raise ConfigError(
            f"the project folder {project} does not exist",
            fix="Pass an existing folder with --project, or run fluffy inside the project.",
            why="fluffy works on an existing project folder",
        )
    if args.task is None:
        from fluffy.cli.interactive import run as interactive

        return interactive(
            str(project),
            cli=cli_settings(args),
            script=args.script,
            session_id=args.session,
            yes=args.yes,
        )
    settings = settings_for(project, cli_settings(args))
    made = None
    if args.branch or (args.branch is None and settings.branch):
        from fluffy.cli.branches import share_environment, start

        made = start(project, args.task)
        share_environment(project, Path(made.path))
        project = Path(made.path)
        (stderr if args.json else stdout).print(
            f"working on branch {escape(made.branch)} in a copy of the repository "
            f"({escape(made.path)}); your checkout is not touched"
        )
    turns = script_turns(args.script) if args.script else None
    options = message_options(settings, turns)
    author = git_identity(project)
    if author is not None:
        options["author"] = author
    notes = stderr if args.json else stdout
    hint = allowlist_hint(project, options)
    if hint is not None:
        notes.print(f"[yellow]WARN:[/] {escape(hint)}")
    terminal = sys.stdin.isatty()
    shown = use_theme(settings.theme)
    renderer = Tally(
        JsonRenderer()
        if args.json
        else SessionRenderer(stdout, prices=settings.prices, palette=shown, asks_below=terminal)
    )
    rejected: list[str] = []

    def on_review(event: Asked) -> str | None:
        if not terminal:
            return None
        if isinstance(event, ExemptionAsked):
            question = f"Grant the TDD exemption {request_text(event)}?"
            return "approve" if ask(question) else "reject"
        if isinstance(event, ToolCallHeld):
            what = (
                f"Run `{visible(event.command)}` in a sandbox"
                if isinstance(event.command, str)
                else f"Allow {event.tool}"
            )
            return ask_call(f"{what}?")
        if ask("Approve?"):
            return "approve"
        if event.can_add_tests and ask("Add tests first, keeping the change?"):
            return "add_tests"
        rejected.append(event.plan_id)
        return "reject"

    # a resumed session changes mode only when asked; a new one starts in the configured mode
    mode = args.mode if args.session else settings.mode
    if not terminal:
        approve_mode(mode, yes=args.yes, confirm=None)  # refused before starting anything
    env_for_task(project, notes)  # the project's dependencies, built offline if missing
    with attached(str(project), say=lambda text: notes.print(escape(text)), yes=args.yes) as kernel:
        client = kernel.client
        show_project(client, project, notes)
        session = get_session(client, args.session) if args.session else None
        session = session or client.call("session.create")
        session = apply_mode(client, session, mode, yes=args.yes, confirm=ask if terminal else None)
        sid = str(session["session_id"])
        after = cursor(client, sid)
        started = client.call(
            "session.message",
            {**options, "session_id": sid, "text": args.task, "auto_approve": args.yes},
        )
        end = follow(
            client,
            sid,
            after,
            renderer,
            on_review=on_review,
            turn_id=started["turn_id"],
        )
        state = client.call("session.get", {"session_id": sid}) or session
        owned = kernel.owned
    tool = end.tool or ""  # a held call waits: the tool it calls
    rule = (
        "a rule allowing that command (syscall: container.run, command: [...])"
        if tool == "container.run"
        else f"a rule allowing {tool.rsplit('.', 1)[0]}.*"
    )
    if end.status == "waiting_review" and end.tool_review and owned:
        # the turn lives in the kernel this command started, which stops as it leaves
        notes.print(
            f"The call to {tool} was not made: it needs your answer, and there "
            "is no terminal here to ask on. This command started the kernel and stops it "
            "as it leaves, so the task ends here. Run it on a terminal (it asks there), at "
            "the prompt (`fluffy`), or with a running kernel (`fluffy start`), or add "
            f"{rule} to .fluffy/policy.yaml."
        )
    elif end.status == "waiting_review" and end.tool_review:
        where = f" --project {project}" if Path.cwd().resolve() != project else ""
        notes.print(
            f"The call to {tool} waits for your answer (session {sid}). Run "
            f"`fluffy session resume {sid}{where}` (or `fluffy` in the project), then "
            f"/approve, /approve all (for this session) or /reject; {rule} in "
            ".fluffy/policy.yaml stops the asking."
        )
    elif end.status == "waiting_review":
        where = f" --project {project}" if Path.cwd().resolve() != project else ""
        notes.print(
            f"The change waits for your review (session {sid}). To decide, run "
            f"`fluffy session resume {sid}{where}` (or `fluffy` in the project), "
            "then /approve or /reject."
        )
    result = outcome(end, str(state.get("state")), renderer)
    if args.json:
        summary = result.event()
        if made is not None:
            summary["branch"] = {"id": made.id, "name": made.branch, "path": made.path}
        renderer.inner.render(summary)
    else:
        word = "green" if result.landed else "red"
        notes.print(f"[bold {word}]{escape(result.line)}[/] [dim](session {escape(sid)})[/]")
        if made is not None:
            notes.print(
                f"On branch {escape(made.branch)}: `fluffy session merge {made.id}` brings it "
                f"into your branch, `fluffy session discard {made.id}` drops it."
            )
    return EXIT_OK if result.landed and not rejected else EXIT_FAILED
