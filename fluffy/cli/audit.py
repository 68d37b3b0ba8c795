"""`fluffy audit verify|log|export`: read and check the audit log from the host."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.markup import escape

from fluffy.cli.render import print_json, status_word, stdout
from fluffy.errors import AuditQueryError, AuditUnavailable, FluffyError
from fluffy.paths import state_dir as default_state_dir

EXIT_OK, EXIT_BROKEN = 0, 1


def _project_files(project: Path) -> dict[str, Path]:
    from fluffy.bootstrap.supervisor import paths
    from fluffy.paths import fluffy_home

    return paths(fluffy_home(), str(project.resolve()))


def _project(args: argparse.Namespace) -> Path:
    return Path(getattr(args, "project", None) or ".").expanduser().resolve()


def _state_dir(args: argparse.Namespace) -> Path:
    """--state-dir; else the project's kernel state (--project, default: the current
    folder); else, with no --project, ~/.fluffy/state when a kernel has kept one there."""
    if args.state_dir:
        folder = Path(args.state_dir).expanduser()
        if not folder.is_dir():
            raise AuditQueryError(
                f"the state folder {folder} does not exist",
                why="fluffy keeps the audit database there once the kernel has run",
                fix="Pass the kernel's state folder with --state-dir.",
            )
        return folder
    project = _project(args)
    folder = _project_files(project)["state"]
    if folder.is_dir():
        return folder
    fallback = default_state_dir()
    if not getattr(args, "project", None) and (fallback / "fluffy.db").is_file():
        return fallback  # `fluffy kernel serve`'s own state
    raise AuditQueryError(
        f"there is no audit log for {project}",
        why="no fluffy kernel has run for this folder (a project's log is kept once its "
        "kernel starts)",
        fix="Run the command in the project's folder, or name it with --project DIR "
        "(or the state folder with --state-dir).",
    )


@contextlib.contextmanager
def _reading(folder: Path) -> Iterator[None]:
    """A damaged database file is an error with a fix, not a traceback."""
    try:
        yield
    except sqlite3.Error as exc:
        raise AuditUnavailable(
            f"the audit database in {folder} cannot be read: {exc}",
            why="the file is damaged (or is not an audit database)",
            fix="Start the kernel (`fluffy kernel serve`): it moves a corrupt database aside "
            "and salvages it or restores the newest backup that verifies.",
        ) from None


def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 1 when the chain is broken or disagrees with a head kept outside it.  Entries
    after the witnessed head are *unwitnessed*: a warning line (``unwitnessed`` in --json)
    with exit 0, since a running or crashed kernel always has a few (ADR-054)."""
    from fluffy.host.audit import read_head, verify

    folder = _state_dir(args)
    witness = None
    if not args.witness and not args.state_dir:  # the bootstrap's witness of this project
        default = _project_files(_project(args))["witness"]
        args.witness = str(default) if default.exists() else None
    if args.witness:
        try:
            witness = read_head(Path(args.witness))
        except ValueError as exc:
            raise AuditQueryError(
                str(exc), fix="Pass the witness file the bootstrap keeps."
            ) from None
        if witness is None:  # never verify "against" a witness that is not there
            raise AuditQueryError(
                f"the witness file {args.witness} is missing or empty",
                why="verifying against an absent witness would silently check nothing",
                fix="Pass the witness file the bootstrap keeps.",
            )
    with _reading(folder):
        report = verify(folder, witness=witness)
    if args.json:
        print_json(report.to_dict())
        return EXIT_OK if report.ok else EXIT_BROKEN
    rate = report.entries / report.seconds if report.seconds else 0.0
    stdout.print(
        f"checked {report.entries} entries in {len(report.files)} file(s) of "
        f"{escape(str(folder))} in {report.seconds:.2f} s ({rate:,.0f}/s)"
    )
    if report.ok and report.entries == 0:
        stdout.print(f"{status_word('warn')} the log has no entries yet: nothing was verified")
        return EXIT_OK
    for warning in report.warnings:
        stdout.print(f"{status_word('warn')} {escape(warning)}")
    if report.unwitnessed is not None and report.witness is not None:
        first, last = report.unwitnessed
        stdout.print(
            f"{status_word('warn')} entries {first}..{last} are unwitnessed: the witness ends at "
            f"entry {report.witness.seq} (a running kernel's newest entries are witnessed within "
            "a second and `fluffy stop` witnesses the last one; otherwise they were written "
            "after the kernel stopped, or its kernel crashed)"
        )
    for chain_break in report.breaks:
        stdout.print(
            f"{status_word('warn')} entry {chain_break['id']} records a chain break at start-up: "
            f"{escape(str(chain_break.get('detail', '')))}"
        )
    if report.ok:
        head = report.head
        where = f" (head: entry {head.seq}, {head.hash[:16]})" if head else ""
        stdout.print(f"{status_word('ok')} the audit chain is intact{where}")
        return EXIT_OK
    problem = report.problem
    assert problem is not None
    where = problem.file if problem.seq is None else f"entry {problem.seq} in {problem.file}"
    stdout.print(
        f"{status_word('fail')} [bold]{problem.kind}[/]: {escape(where)}: {escape(problem.detail)}"
    )
    return EXIT_BROKEN


def _filters(args: argparse.Namespace) -> Any:
    from fluffy.host.audit import Filters, parse_since

    return Filters(
        since_ms=parse_since(args.since) if args.since else None,
        event_type=args.type,
        session=args.session,
        decision=args.decision,
        limit=getattr(args, "limit", None),
    )


def _flush_running(folder: Path) -> None:
    """Ask the kernel that writes ``folder`` (a project kernel's, beside its socket
    folder) to commit what it holds: operational entries wait up to the flush interval.
    No kernel, or one that does not answer: the log as it is on disk."""
    sock = folder.parent / "run" / "kernel.sock"
    if not sock.exists():
        return
    from fluffy.ipc.client import SyncClient

    with contextlib.suppress(FluffyError, OSError), SyncClient(str(sock), timeout=5) as client:
        client.call("audit.flush")


def cmd_log(args: argparse.Namespace) -> int:
    from fluffy.host.audit import entries

    folder = _state_dir(args)
    _flush_running(folder)
    filters = _filters(args)
    with _reading(folder):
        found = list(entries(folder, filters))
    if args.json:
        print_json({"entries": found})
        return EXIT_OK
    for entry in found:
        when = dt.datetime.fromtimestamp(entry["timestamp"] / 1000, dt.UTC)
        decision = entry["policy_decision"] or "-"
        what = entry["syscall_type"] or entry["tool_name"] or ""
        rule = f" rule={entry['policy_rule_name']}" if entry["policy_rule_name"] else ""
        stdout.print(
            f"{entry['id']:>7} {when:%Y-%m-%d %H:%M:%S} {entry['event_type']:<20} "
            f"{decision:<16} {escape(what)}{escape(rule)} {escape(entry['input_summary'][:80])}"
        )
    stdout.print(f"[dim]{len(found)} entr{'y' if len(found) == 1 else 'ies'}[/]")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from fluffy.host.audit import export_jsonl

    folder = _state_dir(args)
    filters = _filters(args)
    with _reading(folder):
        if args.output and args.output != "-":
            with Path(args.output).open("w", encoding="utf-8") as handle:
                count = export_jsonl(folder, handle, filters)
            print(f"exported {count} entries to {args.output}", file=sys.stderr)
        else:
            export_jsonl(folder, sys.stdout, filters)
    return EXIT_OK


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project", help="the project whose log to read (default: .)")
    parser.add_argument(
        "--state-dir",
        help="the kernel's state folder (default: the project's, else ~/.fluffy/state)",
    )


def _filter_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", help='entries since a duration ago ("2h", "7d") or ISO date')
    parser.add_argument("--type", help="only this event type (e.g. syscall, policy_update)")
    parser.add_argument("--session", help="only this session id")
    parser.add_argument(
        "--decision", help="only this decision: allowed, denied, review_required, allowed_by_token"
    )


def add_parser(sub: Any) -> None:
    audit = sub.add_parser("audit", help="verify, read and export the audit log")
    audit_sub = audit.add_subparsers(dest="audit_command", metavar="ACTION", required=True)

    verify = audit_sub.add_parser("verify", help="check the hash chain; exit 1 names the break")
    _common(verify)
    verify.add_argument("--witness", help="a head (seq, hash) kept outside the kernel to check too")
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.set_defaults(func=cmd_verify)

    log = audit_sub.add_parser("log", help="show entries, oldest first")
    _common(log)
    _filter_args(log)
    log.add_argument("--limit", type=int, help="only the newest N matching entries")
    log.add_argument("--json", action="store_true")
    log.set_defaults(func=cmd_log)

    export = audit_sub.add_parser("export", help="write every entry as JSON lines")
    _common(export)
    _filter_args(export)
    export.add_argument("--format", choices=["jsonl"], default="jsonl")
    export.add_argument("--output", "-o", help="file to write (default: stdout)")
    export.set_defaults(func=cmd_export)
