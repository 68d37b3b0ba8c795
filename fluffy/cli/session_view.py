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
from typing import Any, Protocol, assert_never

import msgspec
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape as _markup_escape
from rich.padding import Padding
from rich.status import Status
from rich.syntax import Syntax

from fluffy.cli.diffview import review_files
from fluffy.cli.events import Asked, Ended, Problem, Refusal, Shown, Unknown, plain
from fluffy.cli.mdstream import MarkdownStream
from fluffy.cli.theme import PALETTES, Palette
from fluffy.cli.usage import turn_line
from fluffy.errors import FluffyError
from fluffy.ipc.results.events import (
    ChangesMerged,
    Committed,
    ExemptionAsked,
    Notice,
    RetryScheduled,
    ReviewShown,
    SessionQuarantined,
    StateChanged,
    TextStreamed,
    ToolCallHeld,
    ToolFinished,
    ToolStarted,
    TurnEnded,
    TurnStarted,
)
from fluffy.safetext import visible
from fluffy.settings import Price

DIFF_LINES = 60  # per file; longer diffs are cut with a note (review.show has them whole)


def escape(text: str) -> str:
    """Untrusted text for Rich markup: control characters made visible, markup escaped."""
    return _markup_escape(visible(text))


class Renderer(Protocol):
    def render(self, event: Shown) -> None: ...


class Explained(Protocol):
    """An error as the person reads it: what went wrong, why, and the fix."""

    @property
    def what(self) -> str: ...
    @property
    def why(self) -> str: ...
    @property
    def fix(self) -> str: ...


def error_fields(exc: FluffyError) -> Problem:
    """what / why / fix / code of an error, unpacked again if it crossed the socket.

    The wire carries the parts (``ErrorBody.what``/``why``/``fix``, rebuilt as they came)
    and one message, ``what (why) Fix: fix`` (fluffy.ipc.protocol.error_body); from a
    kernel that sent only the message, the parts are taken back out of it.  The code is
    the kernel's, whichever class the client could rebuild.
    """
    what, why, fix = exc.what, exc.why, exc.fix
    if getattr(exc, "wire_code", None) and not getattr(exc, "wire_parts", False):
        if " Fix: " in what:
            what, fix = what.rsplit(" Fix: ", 1)
        if what.endswith(")") and " (" in what:
            what, why = what[:-1].rsplit(" (", 1)
    return Problem(what=what, why=why, fix=fix, code=getattr(exc, "wire_code", None) or exc.code)


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

    def render(self, event: Shown | dict[str, Any]) -> None:
        """Every event, an unreadable one as it came (fluffy/cli/events.py)."""
        self.write(json.dumps(plain(event), sort_keys=True))


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

    def _error(self, error: Explained, indent: str = "  ") -> None:
        self._line(f"{indent}[bold red]ERROR:[/] {escape(error.what)}")
        if error.why:
            self._line(f"{indent}[bold]Reason:[/] {escape(error.why)}")
        if error.fix:
            self._line(f"{indent}[bold]Fix:[/] {escape(error.fix)}")

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
    def render(self, event: Shown) -> None:
        if isinstance(event, Asked) and self.spinner is not None:
            self.spinner.stop()  # a question may follow: the spinner must not draw over it
            self.spinner = None  # (the next event about a running tool starts it again)
        match event:
            case TurnStarted():
                self._on_turn_start(event)
            case TextStreamed():
                self._on_text_delta(event)
            case ToolStarted():
                self._on_tool_executing(event)
            case ToolFinished():
                self._on_tool_result(event)
            case StateChanged():
                self._on_state(event)
            case ReviewShown():
                self._on_review(event)
            case ExemptionAsked():
                self._on_exemption(event)
            case ToolCallHeld():
                self._on_tool_review(event)
            case ChangesMerged():
                self._on_merged(event)
            case Committed():
                self._on_commit(event)
            case SessionQuarantined():
                self._on_quarantine(event)
            case RetryScheduled():
                self._on_retry(event)
            case Notice() | Refusal():
                self._on_notice(event)
            case TurnEnded() | Ended():
                self._on_turn_end(event)
            case Unknown():  # a newer kernel's event: not for a person (fluffy/cli/events.py)
                pass
            case _:
                assert_never(event)

    def _on_turn_start(self, event: TurnStarted) -> None:
        self.streamed = ""
        self._line(f"[bold]You:[/] {escape(event.text)}")
        self._line()

    def _on_text_delta(self, event: TextStreamed) -> None:
        content = event.content
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

    def _on_tool_executing(self, event: ToolStarted) -> None:
        if self.markdown:
            self._close_text()  # the text so far, before the spinner takes the line
        self.last_tool = event.tool_name
        self.pending[event.call_id] = event.description or event.tool_name
        self._spin()

    def _on_tool_result(self, event: ToolFinished) -> None:
        description = self.pending.pop(event.call_id, None) or event.tool_name
        self._spin()
        self.streamed = ""
        took = duration(event.duration_ms)
        self._line(f"  {escape(description)}... [dim]({took})[/]")
        if event.error is not None:
            self._error(event.error, indent="  ")
        elif event.ok:
            self._line(f"  {escape(event.summary)}")
        else:
            self._line(f"  [red]{escape(event.summary)}[/]")
        self._line()

    def _on_state(self, event: StateChanged) -> None:
        self._line(
            f"  [dim]state: {escape(event.from_)} -> {escape(event.to)}"
            f" ({escape(event.mode)} mode)[/]"
        )

    def _on_review(self, event: ReviewShown) -> None:
        files = review_files(event.files, event.diff)
        auto = event.auto
        head = "Review (auto-approved)" if auto else "Review needed"
        self._line(f"  [bold]{head}:[/] {len(files)} file(s), {event.lines} line(s) changed")
        for reason in event.reasons:
            self._line(f"    - {escape(reason)}")
        if event.tests_requested:
            asked = escape(event.tests_requested)
            self._line(f"    [bold]the AI asks for tests before the merge:[/] {asked}")
        if event.can_add_tests and not auto:
            self._line("    (explore change: /add-tests asks for tests before the merge)")
        added, removed = self.palette.added, self.palette.removed
        for item in files:
            counts = f"{_styled(f'+{item.added}', added)} {_styled(f'-{item.removed}', removed)}"
            self._line(f"  [bold]{escape(item.path)}[/] {counts}")
            if not auto:
                self._diff(item.diff)
        self._line()

    def _on_exemption(self, event: ExemptionAsked) -> None:
        paths = ", ".join(event.paths)
        self._line(
            f"  [bold]The AI asks for a TDD exemption:[/] {escape(event.category)}"
            f" for {escape(paths)}"
        )
        self._line(f"    reason: {escape(event.reason)}")
        self._line(f"    request: {escape(event.request_id or '(no id)')}")
        self._line("    nothing is exempt until you decide: /approve grants it, /reject refuses it")
        self._line()

    def _on_tool_review(self, event: ToolCallHeld) -> None:
        """A call policy holds for the person (an MCP server's tool, ADR-046; a command
        the model wants to run, ADR-062)."""
        if isinstance(event.command, str):  # container.run: the command line, as it will run
            self._line("  [bold]The AI wants to run a command[/] (in a sandbox: no network, "
                       "the project read-only)")  # fmt: skip
            self._line(f"    $ {escape(event.command)}")
        else:
            self._line(f"  [bold]The AI wants to call {escape(event.tool)}[/]")
        self._line(f"    arguments: {escape(event.arguments or '{}')}")
        self._line(f"    why asked: {escape(event.reason)}")
        if event.allow_with:
            self._line(f"    [dim]to stop asking: {escape(event.allow_with)}[/]")
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

    def _on_merged(self, event: ChangesMerged) -> None:
        self._line("  Merging changes...")
        word = "Auto-approved" if event.auto else "Approved"
        self._line(f"  {word}: {escape(event.reason)}")
        self._line()

    def _on_commit(self, event: Committed) -> None:
        for note in event.notes or []:  # what the commit left to the person
            self._line(f"  [yellow]Note:[/] {escape(note)}")
        if self.last_tool == "git.commit" or not event.sha:  # said, or none made
            return
        self._line(f'  Committing: "{escape(event.message)}" [dim]{event.sha[:12]}[/]')
        self._line()

    def _on_quarantine(self, event: SessionQuarantined) -> None:
        self._line(
            f"[bold red]QUARANTINED:[/] the session is read-only "
            f"({event.denials} denials): {escape(event.reason)}"
        )
        self._line(
            "[bold]Fix:[/] Look at what was refused, then /unquarantine to lift it "
            "(your decision is audited)."
        )

    def _on_retry(self, event: RetryScheduled) -> None:
        """A model request failed and waits for another attempt (ADR-044)."""
        restart = " -- the answer above was cut off and starts again" if event.restart else ""
        self._line(f"  [yellow]{escape(event.text or 'retrying')}[/]{restart}")
        if event.why:
            self._line(f"  [dim]{escape(event.why)}[/]")

    def _on_notice(self, event: Notice | Refusal) -> None:
        if isinstance(event, Refusal):
            self._error(event, indent="")
            return
        text = escape(event.what)
        if event.why:
            text += f" ({escape(event.why)})"
        if event.fix:
            text += f" Fix: {escape(event.fix)}"
        self._line(f"[yellow]WARN:[/] {text}" if event.level == "warn" else f"[dim]{text}[/]")

    def _on_turn_end(self, event: TurnEnded | Ended) -> None:
        status = event.status
        text = event.text.strip()
        repeated = text and text == self.streamed.strip()
        self.close()
        tail = f" {escape(text)}" if text and not repeated else ""
        if status == "done":
            self._line(f"[bold green]Done.[/]{tail}")
        elif status == "waiting_review":
            offered = isinstance(event, Ended) and event.can_add_tests
            self._line(
                "[yellow]Waiting for your review:[/] /approve or /reject [reason]"
                + (" (or /add-tests)" if offered else "")
            )
        elif status == "cancelled":
            self._line(f"[yellow]Cancelled.[/]{tail}")
        elif status == "quarantined":
            self._line(f"[bold red]Stopped: the session is quarantined.[/]{tail}")
        else:
            self._line(f"[bold red]Failed.[/]{tail}")
        if event.error is not None:
            self._error(event.error, indent="")
        if isinstance(event, TurnEnded):
            line = turn_line(msgspec.to_builtins(event.usage), self.prices)
            if line is not None:
                self._line(f"[dim]{escape(line)}[/]")
        self._line()
