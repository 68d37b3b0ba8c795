"""`fluffy config policy edit`: change the project's policy through the running kernel.

The policy file is never edited in place: the new text goes to the kernel as
``policy.update``, which validates it, tries it on the last decisions the audit log
recorded and answers with the changes ([BREAKING] = allowed before, denied now).  Only
after the user confirms (or ``--yes``) is it applied, atomically, and audited.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.markup import escape

from fluffy.cli.render import print_json, stdout
from fluffy.errors import ConfigError
from fluffy.paths import kernel_socket


def _edit(text: str) -> str:
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="policy-", delete=False) as tmp:
        tmp.write(text)
        name = tmp.name
    try:
        result = subprocess.run([*shlex.split(editor), name], check=False)
        if result.returncode != 0:
            raise ConfigError(
                f"the editor {editor!r} exited with {result.returncode}; nothing was changed",
                fix="Set VISUAL or EDITOR to an editor that exits 0 when you save.",
            )
        return Path(name).read_text(encoding="utf-8")
    finally:
        Path(name).unlink(missing_ok=True)


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def cmd_policy_edit(args: argparse.Namespace) -> int:
    from fluffy.ipc.client import SyncClient

    socket_path = Path(args.socket) if args.socket else kernel_socket()
    if not socket_path.exists():
        raise ConfigError(
            f"no kernel is listening at {socket_path}",
            why="policy changes go through the running kernel (validated, tried, audited)",
            fix="Start the kernel for the project, or pass its socket with --socket.",
        )
    with SyncClient(str(socket_path), timeout=60) as client:
        current = client.call("policy.get")
        new = Path(args.file).read_text(encoding="utf-8") if args.file else _edit(current["text"])
        if new == current["text"]:
            stdout.print("The policy is unchanged; nothing to do.")
            return 0
        plan: dict[str, Any] = client.call("policy.update", {"text": new})
        if not args.json:
            stdout.print(
                f"Tried on the last {plan['trial_size']} audited decisions: "
                f"{len(plan['changes'])} would change, {plan['breaking']} breaking."
            )
            for line in plan["changes"]:
                style = "bold red" if line.startswith("[BREAKING]") else "yellow"
                stdout.print(f"  [{style}]{escape(line)}[/]")
        phrase = args.phrase
        if plan["needs_phrase"] and phrase is None and sys.stdin.isatty():
            phrase = input(f'Type "{plan["phrase"]}" to accept: ')
        if not (args.yes or _confirm("Apply this policy?")):
            stdout.print("Nothing applied (confirm interactively or pass --yes).")
            return 1
        result = client.call("policy.update", {"text": new, "approve": True, "phrase": phrase})
    if args.json:
        print_json(result)
    else:
        stdout.print(f"[green]Policy applied[/] to {escape(str(current['path']))}.")
    return 0


def add_parser(sub: Any) -> None:
    config = sub.add_parser("config", help="change fluffy's configuration")
    config_sub = config.add_subparsers(dest="config_command", metavar="WHAT", required=True)
    policy = config_sub.add_parser("policy", help="the project's policy")
    policy_sub = policy.add_subparsers(dest="policy_action", metavar="ACTION", required=True)
    edit = policy_sub.add_parser("edit", help="edit the policy through the kernel (reviewed)")
    edit.add_argument("--socket", help="the running kernel's socket")
    edit.add_argument("--file", help="take the new policy from this file instead of an editor")
    edit.add_argument("--yes", action="store_true", help="apply without asking")
    edit.add_argument("--phrase", help="the confirmation phrase for more than 5 breaking changes")
    edit.add_argument("--json", action="store_true")
    edit.set_defaults(func=cmd_policy_edit)
