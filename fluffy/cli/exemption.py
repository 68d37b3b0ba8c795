"""`fluffy exemption request|grant|refuse`: TDD exemptions from the command line.

An exemption changes a session in progress, so these talk to the project's *running*
kernel (``fluffy start``, or a prompt left open); with none running they say so rather
than start one.  ``request`` is the user's own request (``workflow.request_exemption``:
granted when the category's globs in policy.yaml cover every path).  ``grant`` and
``refuse`` answer a request the AI made with its ``workflow.request_exemption`` tool,
which waits for the user (``workflow.decide_exemption``): they show the request and
name it by its id, so the kernel refuses the decision if another request waits.  At the
prompt, /exempt does what ``request`` does, and /approve or /reject answer the AI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
from rich.markup import escape

from fluffy.cli.connect import ask
from fluffy.cli.render import print_json, status_word, stdout
from fluffy.errors import ExemptionDenied, KernelNotRunning, SessionNotFound
from fluffy.host.policy import CATEGORIES
from fluffy.ipc.results.events import ExemptionAsked
from fluffy.safetext import visible

USAGE = "/exempt <category> <path> [<path> ...] -- <reason>"


def parse_exempt(rest: str) -> tuple[str, list[str], str] | None:
    """``/exempt``'s arguments: category, paths, reason (None: not that shape)."""
    head, sep, reason = rest.partition(" -- ")
    words = head.split()
    if not sep or len(words) < 2 or not reason.strip():
        return None
    return words[0], words[1:], reason.strip()


def request(client: Any, session_id: str, category: str, paths: list[str], reason: str) -> str:
    session = client.call(
        "workflow.request_exemption",
        {"session_id": session_id, "category": category, "paths": paths, "reason": reason},
    )
    return granted_text(session)


def request_text(request: ExemptionAsked | dict[str, Any]) -> str:
    """What the AI asks for, as the user is shown it (plain text, control characters
    made visible): category, paths, reason and the request's id (from the ``exemption``
    event, or session.get's ``exemption_pending``)."""
    if isinstance(request, ExemptionAsked):
        request = msgspec.structs.asdict(request)
    paths = ", ".join(str(p) for p in request.get("paths") or [])
    return visible(
        f"{request.get('category')} for {paths} (reason: {request.get('reason') or ''}; "
        f"request {request.get('request_id') or '(no id)'})"
    )


def granted_text(session: dict[str, Any]) -> str:
    exemption = session.get("exemption") or {}
    return (
        f"exemption granted: {exemption.get('category')} for "
        f"{', '.join(exemption.get('paths') or [])}; state {session.get('state')}"
    )


@contextmanager
def running(project: Path) -> Iterator[Any]:
    """The project's running kernel; KernelNotRunning (what/why/fix) when there is none."""
    from fluffy.cli.connect import CALL_TIMEOUT_S
    from fluffy.cli.lifecycle import _status
    from fluffy.ipc.client import SyncClient
    from fluffy.paths import project_socket

    status = _status(str(project))
    if status is None or status.get("health") != "healthy":
        raise KernelNotRunning(
            f"no kernel runs for {project}",
            why="an exemption belongs to a session in progress, which lives in the running kernel",
            fix=f"Start it with `fluffy start --project {project}` (or use /exempt in `fluffy`).",
        )
    sock = project_socket(project)
    with SyncClient(str(sock), timeout=CALL_TIMEOUT_S) as client:
        yield client


def _session(client: Any, wanted: str | None) -> str:
    found = client.call("session.get", {"session_id": wanted} if wanted else {})
    if not found:
        raise SessionNotFound(
            "there is no session to exempt" if wanted is None else f"there is no session {wanted}",
            fix='Start one with `fluffy "a task"` or `fluffy`; `fluffy session list` shows them.',
            why="an exemption is asked for within a session, and the kernel has none to match",
        )
    return str(found["session_id"])


def cmd_exemption_request(args: argparse.Namespace) -> int:
    project = Path(args.project or ".").resolve()
    with running(project) as client:
        sid = _session(client, args.session)
        text = request(client, sid, args.category, list(args.path), args.reason)
        session = client.call("session.get", {"session_id": sid})
    if args.json:
        print_json(session)
    else:
        stdout.print(f"{status_word('ok')} {escape(text)}")
    return 0


def _pending(client: Any, sid: str) -> dict[str, Any]:
    session = client.call("session.get", {"session_id": sid}) or {}
    pending = session.get("exemption_pending")
    if not pending:
        raise ExemptionDenied(
            "no exemption request waits for your decision",
            why=f"the AI has not asked for an exemption in session {sid}, or it was decided",
            fix="`fluffy exemption request` asks for one yourself.",
        )
    return dict(pending)


def cmd_exemption_decide(args: argparse.Namespace) -> int:
    """Grant or refuse the AI's request: the one shown here, named by its id.

    ``--id`` names the request the user saw; without it, a grant is asked about on a
    terminal after the request is shown, and refused elsewhere (a script names the id).
    """
    project = Path(args.project or ".").resolve()
    grant = args.exemption_command == "grant"
    with running(project) as client:
        sid = _session(client, args.session)
        pending = _pending(client, sid)
        shown = request_text(pending)
        request_id = args.id or str(pending.get("request_id") or "")
        if grant and not args.id:
            if not sys.stdin.isatty():
                raise ExemptionDenied(
                    "not granted: name the request you grant with --id",
                    why=f"the AI asks for {shown}",
                    fix=f"fluffy exemption grant --id {request_id} grants it "
                    "(`fluffy exemption refuse` refuses it).",
                )
            stdout.print(f"The AI asks for a TDD exemption: {escape(shown)}")
            if not ask("Grant this TDD exemption?"):
                stdout.print("not granted; the request still waits")
                return 1
        params: dict[str, Any] = {"session_id": sid, "grant": grant, "request_id": request_id}
        if args.reason:
            params["reason"] = args.reason
        session = client.call("workflow.decide_exemption", params)
    if args.json:
        print_json(session)
    elif grant:
        stdout.print(f"{status_word('ok')} {escape(granted_text(session))}")
    else:
        stdout.print(
            f"exemption refused: {escape(shown)}; state {escape(str(session.get('state')))}"
        )
    return 0


def add_parser(sub: Any) -> None:
    exemption = sub.add_parser("exemption", help="TDD exemptions: request, grant, refuse")
    actions = exemption.add_subparsers(dest="exemption_command", metavar="ACTION", required=True)
    ask = actions.add_parser("request", help="exempt files of the session from TDD")
    ask.add_argument("--category", required=True, choices=CATEGORIES, help="what kind of change")
    ask.add_argument(
        "--path", required=True, action="append", help="a file it covers (repeat for more)"
    )
    ask.add_argument("--reason", required=True, help="why TDD does not apply")
    for action, what in (
        ("grant", "grant the exemption the AI asked for"),
        ("refuse", "refuse the exemption the AI asked for"),
    ):
        decide = actions.add_parser(action, help=what)
        decide.add_argument("--reason", help="what to tell the AI (refuse)")
        decide.add_argument(
            "--id", help="the id of the request you decide on, as shown (refused if another)"
        )
        decide.set_defaults(func=cmd_exemption_decide)
        _common(decide)
    ask.set_defaults(func=cmd_exemption_request)
    _common(ask)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project", help="the project folder (default: the current one)")
    parser.add_argument("--session", help="the session (default: the latest)")
    parser.add_argument("--json", action="store_true")
