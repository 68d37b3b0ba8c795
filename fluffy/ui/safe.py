"""Text from a model or a repository, made safe to show (the templates escape HTML).

Escaping stops markup; these stop the rest: control characters (a terminal's escape
sequences, NUL) and the invisible or direction-changing characters a hostile diff uses to
make code read differently (Trojan Source) are shown as ``<U+XXXX>``.
"""

from __future__ import annotations

import datetime as dt
import unicodedata
from typing import Any

#: Bidirectional controls and zero-width characters, shown rather than obeyed.
INVISIBLE = frozenset(
    "\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    "\u2060\u2061\u2062\u2063\u2064\u2066\u2067\u2068\u2069\ufeff"
)


def visible(value: Any) -> str:
    """``value`` as text, every control or invisible character named (tabs and newlines
    kept)."""
    text = "" if value is None else str(value)
    out: list[str] = []
    for char in text:
        if char in "\n\t":
            out.append(char)
        elif char in INVISIBLE or unicodedata.category(char) in ("Cc", "Cf", "Co", "Cs"):
            out.append(f"<U+{ord(char):04X}>")
        else:
            out.append(char)
    return "".join(out)


def diff_lines(diff: str) -> list[tuple[str, str]]:
    """(kind, line) for a unified diff: ``add``, ``del``, ``hunk``, ``file`` or ``same``."""
    kinds: list[tuple[str, str]] = []
    for line in (diff or "").splitlines():
        if line.startswith(("+++", "---")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "same"
        kinds.append((kind, line))
    return kinds


def when(ms: Any) -> str:
    """An entry's time (ms since the epoch) in the viewer's terms: UTC, to the second."""
    try:
        moment = dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return visible(ms)
    return moment.strftime("%Y-%m-%d %H:%M:%S")
