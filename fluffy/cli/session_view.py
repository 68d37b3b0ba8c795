"""Turn a session's events (``session.events``) into what a person reads, or JSON lines.

The layout follows the design's "Interactive Output Rendering": ``You:`` for the task,
the model's text streamed after ``AI:`` as it arrives, each tool call as two indented
lines (what it did with its end-to-end time, then its summary), refusals in the
ERROR / Reason / Fix form, reviews with their diffs, and ``Done.`` at the end.  Rendering
is kept apart from polling (:mod:`fluffy.cli.turns`) so both can be tested on their own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape as _markup_escape
from rich.padding import Padding
from rich.status import Status
from rich.syntax import Syntax

from fluffy.cli.diffview import review_files
from fluffy.cli.mdstream import MarkdownStream
from fluffy.cli.theme import PALETTES, Palette
from fluffy.cli.usage import turn_line
from fluffy.errors import FluffyError
from fluffy.safetext import visible
from fluffy.settings import Price

DIFF_LINES = 60  # per file; longer diffs are cut with a note (review.show has them whole)


def escape(text: str) -> str:
    """Untrusted text for Rich markup: control characters made visible, markup escaped."""
    return _markup_escape(visible(text))


class Renderer(Protocol):
    def render(self, event: dict[str, Any]) -> None: ...


def error_fields(exc: FluffyError) -> dict[str, Any]:
    """what / why / fix / code of an error, unpacked again if it crossed the socket.

    The wire carries one message, ``what (why) Fix: fix`` (fluffy.ipc.protocol.error_body);
    the client rebuilds the class with its default why/fix.  The kernel's own why and fix
    are the specific ones, so they are taken back out of the message.
    """
    what, why, fix = exc.what, exc.why, exc.fix
    if getattr(exc, "wire_code", None):
        if " Fix: " in what:
            what, fix = what.rsplit(" Fix: ", 1)
        if what.endswith(")") and " (" in what:
            what, why = what[:-1].rsplit(" (", 1)
    return {"what": what, "why": why, "fix": fix, "code": exc.code}


def duration(ms: Any) -> str:
    """End-to-end latency as the design shows it: "3ms" under a second, else "1.2s"."""
    try:
        value = float(ms)
    except (TypeError, ValueError):
        return "?"
    return f"{value:.0f}ms" if value < 1000 else f"{value / 1000:.1f}s"


def status_line(mode: Any, state: Any) -> str:
    """The prompt: ``[strict] [idle] > ``."""
    return f"[{mode or '?'}] [{state or '?'}] > "


def _styled(text: str, style: str) -> str:
    return f"[{style}]{text}[/]" if style else text


class JsonRenderer:
    """``--json``: every event as one JSON object per line, nothing else on stdout."""

    def __init__(self, write: Any = print) -> None:
        self.write = write

    def render(self, event: dict[str, Any]) -> None:
        self.write(json.dumps(event, sort_keys=True))


class SessionRenderer:
    """Events to a Rich console, in the order they arrive."""

    def __init__(
        self,
        console: Console,
        *,
        diff_lines: int = DIFF_LINES,
        prices: Mapping[str, Price] | None = None,
        palette: Palette = PALETTES["dark"],
        markdown: bool | None = None,
        asks_below: bool = False,
    ) -> None:
        self.console = console
        #: a held call is answered at a question printed under it (``fluffy "task"``),
        #: not with the prompt's /approve commands
        self.asks_below = asks_below
        self.diff_lines = diff_lines
        self.prices: Mapping[str, Price] = prices or {}
        self.palette = palette
        #: the model's text as Markdown (default: on a terminal; raw text when piped)
        self.markdown = console.is_terminal if markdown is None else markdown
        self.blocks = MarkdownStream(palette.syntax)
        self.blocks_shown = 0  # in the current run of text
        self.in_text = False  # inside a streamed "AI: ..." line
        self.streamed = ""  # the AI text since the last other output (to avoid repeating it)
        self.pending: dict[str, str] = {}  # call_id -> description of running tools
        self.spinner: Status | None = None
        self.last_tool = ""  # the latest tool call's name

    # -- low-level output -----------------------------------------------------------------
    def _line(self, markup: str = "") -> None:
        self._close_text()
        self.console.print(markup, highlight=False)

    def _close_text(self) -> None:
        if not self.in_text:
            return
        if self.markdown:
            self._markdown(self.blocks.flush())
        else:
            self.console.print()  # end the streamed line
        self.console.print()
        self.in_text = False

    def _markdown(self, block: Markdown | None) -> None:
        if block is None:
            return
        if self.blocks_shown:
            self.console.print()  # the space Markdown keeps between blocks
        self.console.print(block, soft_wrap=False)
        self.blocks_shown += 1

    def _error(self, error: dict[str, Any], indent: str = "  ") -> None:
        self._line(f"{indent}[bold red]ERROR:[/] {escape(str(error.get('what') or ''))}")
        if error.get("why"):
            self._line(f"{indent}[bold]Reason:[/] {escape(str(error['why']))}")
        if error.get("fix"):
            self._line(f"{indent}[bold]Fix:[/] {escape(str(error['fix']))}")

    def _spin(self) -> None:
        """A spinner naming the running tools, only on a live terminal."""
        if not self.console.is_terminal:
            return
        if not self.pending:
            if self.spinner is not None:
                self.spinner.stop()
                self.spinner = None
            return
        text = escape(", ".join(self.pending.values())) + "..."
        if self.spinner is None:
            self.spinner = self.console.status(text)
            self.spinner.start()
        else:
            self.spinner.update(text)

    def close(self) -> None:
        """Finish a streamed line and stop the spinner (end of a turn, or interrupted)."""
        self.pending.clear()
        self._spin()
        self._close_text()

    # -- the events -----------------------------------------------------------------------
    def render(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind in ("review", "exemption", "tool_review") and self.spinner is not None:
            self.spinner.stop()  # a question may follow: the spinner must not draw over it
            self.spinner = None  # (the next event about a running tool starts it again)
        handler = getattr(self, f"_on_{kind}", None)
        if handler is None:  # a newer kernel's event: say it plainly rather than drop it
            self._line(f"  [dim]{escape(str(kind))}: {escape(json.dumps(event))}[/]")
            return
        handler(event)

    def _on_turn_start(self, event: dict[str, Any]) -> None:
        self.streamed = ""
        self._line(f"[bold]You:[/] {escape(str(event.get('text', '')))}")
        self._line()

    def _on_text_delta(self, event: dict[str, Any]) -> None:
        content = str(event.get("content", ""))
        if not content:
            return
        if not self.in_text:
            if self.markdown:
                self.console.print("[bold cyan]AI:[/]", highlight=False)
                self.blocks_shown = 0
            else:
                self.console.print("[bold cyan]AI:[/] ", end="", highlight=False)
            self.in_text = True
            self.streamed = ""
        self.streamed += content
        if self.markdown:
            self._markdown(self.blocks.feed(content))
            return
        self.console.print(visible(content), end="", markup=False, highlight=False, soft_wrap=True)

    def _on_tool_executing(self, event: dict[str, Any]) -> None:
        if self.markdown:
            self._close_text()  # the text so far, before the spinner takes the line
        self.last_tool = str(event.get("tool_name") or "")
        self.pending[str(event.get("call_id"))] = str(
            event.get("description") or event.get("tool_name")
        )
        self._spin()

    def _on_tool_result(self, event: dict[str, Any]) -> None:
        call = str(event.get("call_id"))
        description = self.pending.pop(call, None) or str(event.get("tool_name"))
        self._spin()
        self.streamed = ""
        took = duration(event.get("duration_ms"))
        self._line(f"  {escape(description)}... [dim]({took})[/]")
        error = event.get("error")
        if isinstance(error, dict):
            self._error(error, indent="  ")
        elif event.get("ok", True):
            self._line(f"  {escape(str(event.get('summary', '')))}")
        else:
            self._line(f"  [red]{escape(str(event.get('summary', '')))}[/]")
        self._line()

    def _on_state(self, event: dict[str, Any]) -> None:
        self._line(
            f"  [dim]state: {escape(str(event.get('from')))} -> {escape(str(event.get('to')))}"
            f" ({escape(str(event.get('mode')))} mode)[/]"
        )

    def _on_review(self, event: dict[str, Any]) -> None:
        files = review_files(event)
        auto = bool(event.get("auto"))
        head = "Review (auto-approved)" if auto else "Review needed"
        self._line(
            f"  [bold]{head}:[/] {len(files)} file(s), {event.get('lines', '?')} line(s) changed"
        )
        for reason in event.get("reasons") or []:
            self._line(f"    - {escape(str(reason))}")
        if event.get("tests_requested"):
            asked = escape(str(event["tests_requested"]))
            self._line(f"    [bold]the AI asks for tests before the merge:[/] {asked}")
        if event.get("can_add_tests") and not auto:
            self._line("    (explore change: /add-tests asks for tests before the merge)")
        added, removed = self.palette.added, self.palette.removed
        for item in files:
            counts = f"{_styled(f'+{item.added}', added)} {_styled(f'-{item.removed}', removed)}"
            self._line(f"  [bold]{escape(item.path)}[/] {counts}")
            if not auto:
                self._diff(item.diff)
        self._line()

    def _on_exemption(self, event: dict[str, Any]) -> None:
        paths = ", ".join(str(p) for p in event.get("paths") or [])
        self._line(
            f"  [bold]The AI asks for a TDD exemption:[/] {escape(str(event.get('category')))}"
            f" for {escape(paths)}"
        )
        self._line(f"    reason: {escape(str(event.get('reason') or ''))}")
        self._line(f"    request: {escape(str(event.get('request_id') or '(no id)'))}")
        self._line("    nothing is exempt until you decide: /approve grants it, /reject refuses it")
        self._line()

    def _on_tool_review(self, event: dict[str, Any]) -> None:
        """A call policy holds for the person (an MCP server's tool, ADR-046; a command
        the model wants to run, ADR-062)."""
        command = event.get("command")
        if command is not None:  # container.run: the command line, as it will run
            self._line("  [bold]The AI wants to run a command[/] (in a sandbox: no network, "
                       "the project read-only)")  # fmt: skip
            self._line(f"    $ {escape(str(command))}")
        else:
            self._line(f"  [bold]The AI wants to call {escape(str(event.get('tool')))}[/]")
        self._line(f"    arguments: {escape(str(event.get('arguments') or '{}'))}")
        self._line(f"    why asked: {escape(str(event.get('reason') or ''))}")
        if event.get("allow_with"):
            self._line(f"    [dim]to stop asking: {escape(str(event['allow_with']))}[/]")
        self._line(
            "    nothing runs until you answer below"
            if self.asks_below
            else "    nothing runs until you decide: /approve (once), /approve all (this "
            "session), /reject \\[why]"
        )
        self._line()

    def _diff(self, diff: str) -> None:
        lines = diff.splitlines()
        if not lines:
            return
        shown = visible("\n".join(lines[: self.diff_lines]))
        self._close_text()
        syntax = Syntax(shown, "diff", theme=self.palette.syntax, word_wrap=True)
        self.console.print(Padding(syntax, (0, 0, 0, 4)))
        if len(lines) > self.diff_lines:
            self._line(f"  [dim]... {len(lines) - self.diff_lines} more diff line(s) not shown[/]")

    def _on_merged(self, event: dict[str, Any]) -> None:
        self._line("  Merging changes...")
        word = "Auto-approved" if event.get("auto") else "Approved"
        self._line(f"  {word}: {escape(str(event.get('reason') or ''))}")
        self._line()

    def _on_commit(self, event: dict[str, Any]) -> None:
        for note in event.get("notes") or []:  # what the commit left to the person
            self._line(f"  [yellow]Note:[/] {escape(str(note))}")
        if self.last_tool == "git.commit" or not event.get("sha"):  # said, or none made
            return
        sha = str(event.get("sha"))[:12]
        self._line(f'  Committing: "{escape(str(event.get("message", "")))}" [dim]{sha}[/]')
        self._line()

    def _on_quarantine(self, event: dict[str, Any]) -> None:
        self._line(
            f"[bold red]QUARANTINED:[/] the session is read-only "
            f"({event.get('denials', '?')} denials): {escape(str(event.get('reason', '')))}"
        )
        self._line(
            "[bold]Fix:[/] Look at what was refused, then /unquarantine to lift it "
            "(your decision is audited)."
        )

    def _on_retry(self, event: dict[str, Any]) -> None:
        """A model request failed and waits for another attempt (ADR-044)."""
        restart = (
            " -- the answer above was cut off and starts again" if event.get("restart") else ""
        )
        self._line(f"  [yellow]{escape(str(event.get('text') or 'retrying'))}[/]{restart}")
        if event.get("why"):
            self._line(f"  [dim]{escape(str(event['why']))}[/]")

    def _on_notice(self, event: dict[str, Any]) -> None:
        level = event.get("level", "info")
        if level == "error":
            self._error(event, indent="")
            return
        text = escape(str(event.get("what", "")))
        if event.get("why"):
            text += f" ({escape(str(event['why']))})"
        if event.get("fix"):
            text += f" Fix: {escape(str(event['fix']))}"
        self._line(f"[yellow]WARN:[/] {text}" if level == "warn" else f"[dim]{text}[/]")

    def _on_turn_end(self, event: dict[str, Any]) -> None:
        status = event.get("status")
        text = str(event.get("text") or "").strip()
        repeated = text and text == self.streamed.strip()
        self.close()
        tail = f" {escape(text)}" if text and not repeated else ""
        error = event.get("error")
        if status == "done":
            self._line(f"[bold green]Done.[/]{tail}")
        elif status == "waiting_review":
            self._line(
                "[yellow]Waiting for your review:[/] /approve or /reject [reason]"
                + (" (or /add-tests)" if event.get("can_add_tests") else "")
            )
        elif status == "cancelled":
            self._line(f"[yellow]Cancelled.[/]{tail}")
        elif status == "quarantined":
            self._line(f"[bold red]Stopped: the session is quarantined.[/]{tail}")
        else:
            self._line(f"[bold red]Failed.[/]{tail}")
        if isinstance(error, dict):
            self._error(error, indent="")
        usage = event.get("usage")
        line = turn_line(usage, self.prices) if isinstance(usage, dict) else None
        if line is not None:
            self._line(f"[dim]{escape(line)}[/]")
        self._line()
