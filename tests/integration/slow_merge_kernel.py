"""`fluffy` with every merge step slowed: the crash test's window to kill the kernel in
the middle of a merge.  A test's own entry point, so that no production code reads a
test hook: ``python -m tests.integration.slow_merge_kernel DELAY_S kernel serve ...``.

It gives the merger the step hook its constructor takes (``on_step``, called after each
applied step), then runs the `fluffy` command line with the remaining arguments.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from fluffy.kernel.merge import merger


def slow_merges(delay_s: float) -> None:
    """Every Merger made from now on sleeps ``delay_s`` after each applied step."""
    made = merger.Merger.__init__

    def pause(operation: object, phase: str) -> None:
        if phase.startswith("applied:"):
            time.sleep(delay_s)

    def slowed(self: merger.Merger, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("on_step", pause)
        made(self, *args, **kwargs)

    merger.Merger.__init__ = slowed  # type: ignore[method-assign]


def main() -> int:
    slow_merges(float(sys.argv[1]))
    from fluffy.cli.main import main as fluffy

    return fluffy(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
