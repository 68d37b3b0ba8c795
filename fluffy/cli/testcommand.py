"""A project's own test command waits for the person's yes on this machine (ADR-081);
the secret files its tests do not see, and the person's allowances (ADR-097).

``tests: command:`` in ``.fluffy/config.yaml`` writes the report fluffy reads as the TDD
evidence, and a cloned repository can ship that file; the kernel runs such a command only
once its digest is in the approvals the host keeps in the kernel's state folder.  The
question is asked when `fluffy` starts the project's kernel (at a terminal only:
``--yes`` does not answer it) and by ``fluffy config tests approve``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from fluffy.cli.render import print_json, status_word, stdout
from fluffy.errors import ConfigError, FluffyError
from fluffy.pathnames import shown

if TYPE_CHECKING:
    from fluffy.host.project import TestCommand


def state_of(project: Path) -> Path:
    from fluffy.bootstrap.supervisor import paths
    from fluffy.paths import fluffy_home

    return paths(fluffy_home(), str(project))["state"]


def unapproved(project: Path, state: Path) -> TestCommand | None:
    """The project's test command when the person has not approved it here (None: it
    has none, it is approved, or the file does not load: the kernel reports that)."""
    from fluffy.host.project import approved, load_test_command

    try:
        command = load_test_command(project)
    except FluffyError:
        return None
    if command is None or command.command is None or command.digest() in approved(state):
        return None
    return command


def _question(command: TestCommand) -> str:
    return (
        f"This project's .fluffy/config.yaml runs its tests with `{command.shown()}`; what "
        "that command reports decides what counts as green. Let fluffy run it?"
    )


def ask_at_start(project: Path, state: Path, ask: Callable[[str], bool]) -> None:
    """As the kernel starts: ask about an unapproved test command (``ask``: the terminal,
    never ``--yes``); a no leaves it unapproved, said once."""
    from fluffy.host.project import approve

    command = unapproved(project, state)
    if command is None:
        return
    if ask(_question(command)):
        approve(state, command)
        return
    stdout.print(
        f"{status_word('warn')} the project's test command is not approved: test.run will "
        "not run it (`fluffy config tests approve` shows it and asks)."
    )


def cmd_tests_approve(args: argparse.Namespace) -> int:
    from fluffy.cli.connect import ask
    from fluffy.host.project import approve, approved, load_test_command

    project = Path(args.project or ".").resolve()
    command = load_test_command(project)
    if command is None or command.command is None:
        raise ConfigError(
            f"{project}/.fluffy/config.yaml names no test command",
            why="only a `tests: command:` needs approving: fluffy runs pytest (or the "
            "JavaScript runner it found) without one",
            fix="Nothing to do; to use your own command, add `tests: command:` first.",
        )
    state = state_of(project)
    already = command.digest() in approved(state)  # the file read once, above
    if not already and not args.yes and not ask(_question(command)):
        stdout.print(
            f"Not approved: `{escape(command.shown())}`; test.run will not run it (`--yes` "
            "approves this command without a question)."
        )
        return 1
    if not already:
        approve(state, command)
    if args.json:
        print_json({"project": str(project), "command": command.shown(), "approved": True})
        return 0
    said = "was already approved" if already else "is approved"
    stdout.print(
        f"{status_word('ok')} `{escape(command.shown())}` {said} for {escape(str(project))}"
    )
    return 0


def _inside(project: Path, raw: str) -> str:
    """``raw`` as a path of the project (``/``-separated, relative), or ConfigError."""
    path = Path(os.path.normpath(raw))
    if path.is_absolute():
        path = path.relative_to(project) if path.is_relative_to(project) else Path("..")
    rel = path.as_posix()
    if rel in (".", "") or rel == ".." or rel.startswith("../"):
        raise ConfigError(
            f"{raw!r} is not a file inside {project}",
            why="an allowance names one of the project's own files",
            fix="Name the file relative to the project, e.g. `--allow .env`.",
        )
    return rel


def cmd_tests_secrets(args: argparse.Namespace) -> int:
    """Show which of the project's secret files test runs leave out; ``--allow`` lets
    them read one, ``--forget`` takes that back (ADR-097)."""
    from fluffy.host.project import allowed_secrets, kept_out, set_allowed

    project = Path(args.project or ".").resolve()
    state = state_of(project)
    wanted = set(allowed_secrets(state))
    allow = {_inside(project, raw) for raw in args.allow}
    forget = {_inside(project, raw) for raw in args.forget}
    if allow or forget:
        wanted = (wanted | allow) - forget
        set_allowed(state, wanted)
    out, seen = kept_out(project, state)
    if args.json:  # a name that is not UTF-8 as git quotes it, as the text shows it
        print_json({"project": str(project), "kept_out": [shown(rel) for rel in out],
                    "allowed": [shown(rel) for rel in sorted(wanted)],
                    "allowed_present": [shown(rel) for rel in seen]})  # fmt: skip
        return 0
    if out:
        stdout.print("Test runs do not see these files (they hold secrets, and git does not "
                     "hold them as they are):")  # fmt: skip
        for rel in out:
            stdout.print(f"  {escape(shown(rel))}")
    else:
        stdout.print(f"{status_word('ok')} test runs see every file of the project")
    for name in sorted(wanted):
        shown_name = escape(shown(name))
        stdout.print(f"Allowed: {shown_name}" + ("" if name in seen else " (not present)"))
    if out:
        stdout.print("`fluffy config tests secrets --allow PATH` lets test runs read one.")
    return 0


def add_parser(config_sub: Any) -> None:
    tests = config_sub.add_parser(
        "tests", help="the project's own test command; the secret files tests do not see"
    )
    tests_sub = tests.add_subparsers(dest="tests_action", metavar="ACTION", required=True)
    approve = tests_sub.add_parser(
        "approve", help="let fluffy run .fluffy/config.yaml's test command (shows it, asks)"
    )
    approve.add_argument("--project", help="the project folder (default: here)")
    approve.add_argument("--yes", action="store_true", help="approve without asking")
    approve.add_argument("--json", action="store_true")
    approve.set_defaults(func=cmd_tests_approve)
    secrets = tests_sub.add_parser(
        "secrets", help="the files that hold secrets test runs leave out (show, allow, forget)"
    )
    secrets.add_argument("--project", help="the project folder (default: here)")
    secrets.add_argument("--allow", action="append", default=[], metavar="PATH",
                         help="let test runs read this file (relative to the project)")  # fmt: skip
    secrets.add_argument("--forget", action="append", default=[], metavar="PATH",
                         help="take an allowance back")  # fmt: skip
    secrets.add_argument("--json", action="store_true")
    secrets.set_defaults(func=cmd_tests_secrets)
