"""Text from models and sandboxes, made safe to show a person on a terminal.

A model's text, a file it wrote (in a review's diff), a tool's output and an error a
sandbox raised are all untrusted bytes.  Printed raw, an escape sequence can rewrite
what the person sees: move the cursor over a line (``+ assert True`` shown over
``os.system(...)``), hide text, set the window title, or make the terminal answer.
Unicode bidirectional overrides reorder what is displayed ("Trojan Source").  Every
such character is shown instead as a visible, unambiguous token (``\\x1b``, ``\\r``,
``<U+202E>``), so what a person reads is what the bytes are.  Newlines and tabs stay.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console

#: C0 controls but tab and newline, DEL, C1 controls, bidi embeddings/overrides/isolates,
#: zero-width and direction marks, the byte-order mark, the line/paragraph separators.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _token(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code == 0x0D:
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"<U+{code:04X}>"


def visible(text: str) -> str:
    """``text`` with every character that can hide or rewrite what is shown made visible."""
    return _HIDDEN.sub(_token, text)


class SafeConsole(Console):
    """A Rich console whose ``print`` shows no raw control character from any text."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(visible(o) if isinstance(o, str) else o for o in objects), **kwargs)
