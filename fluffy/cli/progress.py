"""Build progress for `fluffy images build`: a live status line on a terminal, plain
step lines otherwise (CI logs)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.status import Status

from fluffy.images.builder import ImageStatus
from fluffy.images.spec import ImageSpec


class ConsoleReporter:
    """Implements :class:`fluffy.images.builder.Reporter` on a Rich console."""

    def __init__(self, console: Console, *, verbose: bool = False) -> None:
        self.console = console
        self.verbose = verbose
        self._status: Status | None = None
        self._started = 0.0

    def _stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def message(self, text: str) -> None:
        self.console.print(f"  [dim]·[/] {escape(text)}")

    def image_started(self, spec: ImageSpec, ref: str) -> None:
        self._started = time.monotonic()
        self.console.print(f"[bold]building[/] {escape(ref)}  [dim]{escape(spec.description)}[/]")
        if self.console.is_terminal:
            self._status = self.console.status(f"{spec.name}: staging the build context")
            self._status.start()

    def step(self, spec: ImageSpec, index: int, total: int, text: str) -> None:
        elapsed = time.monotonic() - self._started
        summary = text if len(text) < 90 else text[:87] + "..."
        line = f"{spec.name}: step {index}/{total} ({elapsed:.0f}s) {summary}"
        if self._status is not None:
            self._status.update(escape(line))
        else:
            self.console.print(f"  {escape(line)}")

    def line(self, spec: ImageSpec, text: str) -> None:
        if self.verbose:
            self.console.print(f"    [dim]{escape(text)}[/]")

    def image_done(self, status: ImageStatus) -> None:
        self._stop()
        if status.state == "built":
            self.console.print(f"[green]built[/]   {escape(status.ref)} in {status.seconds:.1f}s")
        else:
            self.console.print(f"[green]current[/] {escape(status.ref)}")
