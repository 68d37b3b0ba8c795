"""`fluffy session list|resume`: the project's sessions, kept by its kernel (SQLite).

Both go through the kernel (joined if it runs, else started for the command and
stopped after): the kernel verifies each session against its chained state log, so
the CLI never reads the database behind its back.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from fluffy.cli.render import print_json, stderr, stdout
from fluffy.cli.usage import cost, dollars, tokens
from fluffy.errors import FluffyError
from fluffy.settings import Price


def _project(args: argparse.Namespace) -> str:
    return str(Path(args.project or ".").resolve())


def when(value: Any) -> str:
    """Milliseconds since the epoch (the kernel's clock) as local time."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = value / 1000 if value > 1e11 else value
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))
    return "" if value is None else str(value)


def usage_cells(usage: Any, prices: Mapping[str, Price]) -> tuple[str, str]:
    """The tokens (in / out) and cost columns of one session ("-": none reported)."""
    if not isinstance(usage, dict) or not usage.get("reported"):
        return "-", "-"
    shown = (
        f"{tokens(int(usage.get('input_tokens', 0)))}/{tokens(int(usage.get('output_tokens', 0)))}"
    )
    spent = cost(usage.get("models") or {}, prices)
    return shown, "n/a" if spent is None else dollars(spent)


def sessions_table(
    sessions: list[dict[str, Any]], prices: Mapping[str, Price] | None = None
) -> Table:
    """The sessions; ``tokens`` is input/output as reported, ``cost`` only with prices."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    columns = ["id", "mode", "state", "updated", "tokens in/out"]
    columns += ["cost"] if prices else []
    for column in [*columns, "title"]:
        table.add_column(column, overflow="fold" if column == "title" else "ellipsis")
    for item in sessions:
        shown, spent = usage_cells(item.get("usage"), prices or {})
        row = [
            escape(str(item.get("session_id"))),
            escape(str(item.get("mode"))),
            escape(str(item.get("state"))),
            when(item.get("updated_at")),
            shown,
        ]
        row += [spent] if prices else []
        table.add_row(*row, escape(str(item.get("title") or "")))
    return table


def cmd_session_list(args: argparse.Namespace) -> int:
    notes = stderr if args.json else stdout
    sessions = _listed(_project(args), args.limit, notes)
    if args.json:
        print_json({"sessions": sessions})
    elif not sessions:
        stdout.print('no sessions yet: `fluffy "a task"` or `fluffy` starts one')
    else:
        from fluffy.settings import load_settings

        prices = load_settings(Path(_project(args)), {}).prices
        stdout.print(sessions_table(sessions, prices))
    return 0


def _listed(project: str, limit: int, notes: Any) -> list[dict[str, Any]]:
    """The project's sessions: from its kernel when one runs (or starts), else read
    from its stored state (a listing starts no kernel); a kernel is started only when
    that state cannot be read."""
    import asyncio
    import sqlite3

    from fluffy.cli.connect import attached
    from fluffy.cli.lifecycle import _status

    if _status(project) is None:  # no supervisor: nothing writes the state now
        from fluffy.bootstrap.supervisor import paths
        from fluffy.host.sessions import sessions_at_rest
        from fluffy.paths import fluffy_home

        try:
            state = paths(fluffy_home(), project)["state"]
            return asyncio.run(sessions_at_rest(state, limit))
        except (sqlite3.Error, OSError, FluffyError) as exc:
            notes.print(escape(f"the stored sessions cannot be read here ({exc}): asking a kernel"))
    with attached(project, say=lambda text: notes.print(escape(text))) as kernel:
        answer = kernel.client.call("session.list", {"limit": limit})
    return list(answer.get("sessions") or [])


def cmd_session_resume(args: argparse.Namespace) -> int:
    from fluffy.cli.interactive import run

    return run(_project(args), session_id=args.session_id, yes=args.yes)


def cmd_session_branches(args: argparse.Namespace) -> int:
    from fluffy.cli.branches import branches

    found = branches(Path(_project(args)))
    if args.json:
        print_json({"branches": [vars(b) for b in found.values()]})
        return 0
    if not found:
        stdout.print('no branch sessions: `fluffy "a task" --branch` starts one')
        return 0
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("id", "branch", "started", "task"):
        table.add_column(column)
    for item in found.values():
        table.add_row(escape(item.id), escape(item.branch), when(item.created_at),
                      escape(item.task))  # fmt: skip
    stdout.print(table)
    return 0


def cmd_session_merge(args: argparse.Namespace) -> int:
    from fluffy.cli.branches import merge

    done = merge(Path(_project(args)), args.branch_id)
    if args.json:
        print_json(done)
    else:
        stdout.print(
            f"merged {escape(done['branch'])} ({done['commits']} commit(s)) into your branch; "
            "its copy is removed"
        )
    return 0


def cmd_session_discard(args: argparse.Namespace) -> int:
    from fluffy.cli.branches import discard

    done = discard(Path(_project(args)), args.branch_id)
    if args.json:
        print_json(done)
    else:
        stdout.print(f"discarded {escape(done['branch'])} and its copy")
    return 0


def add_parser(sub: Any) -> None:
    session = sub.add_parser(
        "session", help="the project's sessions: list, resume; branch sessions: merge, discard"
    )
    actions = session.add_subparsers(dest="session_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="the sessions, newest first")
    listing.add_argument("--project", help="the project folder (default: the current one)")
    listing.add_argument("--limit", type=int, default=20, help="at most this many (20)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_session_list)
    resume = actions.add_parser("resume", help="the prompt on an earlier session")
    resume.add_argument("session_id", metavar="ID", help="the session (see `fluffy session list`)")
    resume.add_argument("--project", help="the project folder (default: the current one)")
    resume.add_argument("--yes", action="store_true", help="approve debug mode if asked")
    resume.set_defaults(func=cmd_session_resume)
    listed = actions.add_parser("branches", help="the sessions running on branches of their own")
    merging = actions.add_parser("merge", help="bring a branch session's commits into your branch")
    dropping = actions.add_parser("discard", help="remove a branch session, its copy and branch")
    for parser in (merging, dropping):
        parser.add_argument("branch_id", metavar="ID", help="see `fluffy session branches`")
    for parser, func in (
        (listed, cmd_session_branches),
        (merging, cmd_session_merge),
        (dropping, cmd_session_discard),
    ):
        parser.add_argument("--project", help="the project folder (default: the current one)")
        parser.add_argument("--json", action="store_true")
        parser.set_defaults(func=func)
