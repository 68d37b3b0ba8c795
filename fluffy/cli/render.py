"""Rendering for people: errors as what / why / fix, check tables, JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.markup import escape

from fluffy.cli.safetext import SafeConsole
from fluffy.cli.theme import Palette, apply, palette
from fluffy.errors import FluffyError

#: Every line fluffy prints goes through these: no raw control character reaches the
#: terminal, whatever text a model or a sandbox produced (fluffy.cli.safetext).
stdout = SafeConsole(highlight=False, soft_wrap=True)
stderr = SafeConsole(stderr=True, highlight=False, soft_wrap=True)


def use_theme(setting: str) -> Palette:
    """The ``theme`` setting's palette, applied to fluffy's consoles (plain: no colour)."""
    chosen = palette(setting)
    apply(chosen, stdout, stderr)
    return chosen


_STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}


def print_error(error: FluffyError, *, as_json: bool = False) -> None:
    """The design's error display standard: ERROR / Reason / Fix."""
    if as_json:
        print(json.dumps({"ok": False, "error": error.to_dict()}), file=sys.stdout)
        return
    stderr.print(f"[bold red]ERROR:[/] {escape(error.what)}")
    if error.why:
        stderr.print(f"[bold]Reason:[/] {escape(error.why)}")
    if error.fix:
        stderr.print(f"[bold]Fix:[/] {escape(error.fix)}")
    if error.context:
        stderr.print(f"[dim]Context: {escape(error.context)}[/]")
    stderr.print(f"[dim]({error.code})[/]")


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def status_word(status: str) -> str:
    style = _STATUS_STYLE.get(status, "white")
    return f"[{style}]{status.upper():<4}[/]"
