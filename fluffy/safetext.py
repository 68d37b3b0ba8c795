"""Untrusted text made safe to show on a terminal: every character that can hide or
rewrite what is displayed becomes a visible, unambiguous token.

A model's text, a file it wrote (in a review's diff), a tool's or a command's output and
an error a sandbox raised are all untrusted bytes.  Printed raw, an escape sequence can
rewrite what the person sees: move the cursor over a line (``+ assert True`` shown over
``os.system(...)``), hide text, set the window title, or make the terminal answer.
Unicode bidirectional overrides reorder what is displayed ("Trojan Source").  Each such
character is shown instead as ``\\x1b``, ``\\r`` or ``<U+202E>``, so what a person reads
is what the bytes are.  Newlines and tabs stay.  Standard library only: the CLI and the
sandboxes' plugins (``container.run``'s output) both use it.
"""

from __future__ import annotations

import re

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
