"""`fluffy ui`: the project's sessions, reviews, audit log and policy in the browser."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape

from fluffy.cli.render import stdout


def cmd_ui(args: argparse.Namespace) -> int:
    from fluffy.cli.connect import attached
    from fluffy.ui.serve import serve

    project = Path(args.project or ".").expanduser().resolve()

    def say(text: str) -> None:
        stdout.print(escape(text))

    with attached(str(project), say=say, yes=args.yes) as kernel:  # stopped after if started
        return serve(
            project, port=args.port, open_browser=not args.no_open, say=say, owned=kernel.owned
        )


def add_parser(sub: Any) -> None:
    ui = sub.add_parser(
        "ui", help="the project's sessions, reviews and audit log in the browser (local only)"
    )
    ui.add_argument("--project", help="the project folder (default: the current one)")
    ui.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    ui.add_argument("--no-open", action="store_true", help="print the address, open no browser")
    ui.add_argument("--yes", "-y", action="store_true", help="approve start-up's questions")
    ui.set_defaults(func=cmd_ui)
