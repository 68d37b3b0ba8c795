"""Unified diffs of one file, as the kernel applies them (patch output mode).

Headers are ``--- a/<path>`` / ``+++ b/<path>``, with ``/dev/null`` on the side where the
file does not exist; lines split on ``\\n`` only (a ``\\r`` stays part of its line), and a
last line without a newline is followed by ``\\ No newline at end of file``, as in
``git diff``.  Standard library only.
"""

from __future__ import annotations

import difflib

NO_NEWLINE = "\\ No newline at end of file\n"


def split_lines(text: str) -> list[str]:
    """``text`` as lines that keep their ``\\n`` (the last one may have none)."""
    if not text:
        return []
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_diff(path: str, old: str | None, new: str | None, context: int = 3) -> str:
    """The diff turning ``old`` into ``new`` (None: the file does not exist on that side).

    Empty when there is nothing a patch can express (equal texts, or an empty file
    created or deleted): the caller then writes the full file instead.
    """
    before, after = split_lines(old or ""), split_lines(new or "")
    out: list[str] = []
    for line in difflib.unified_diff(
        before,
        after,
        "/dev/null" if old is None else f"a/{path}",
        "/dev/null" if new is None else f"b/{path}",
        n=context,
    ):
        out.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE)
    return "".join(out)
