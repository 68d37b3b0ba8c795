"""Untrusted text made safe to show on a terminal: no character in it can hide or rewrite
what is displayed.

A model's text, a file it wrote (in a review's diff), a tool's or a command's output and
an error a sandbox raised are all untrusted bytes.  Printed raw, an escape sequence can
rewrite what the person sees: move the cursor over a line (``+ assert True`` shown over
``os.system(...)``), hide text, set the window title, or make the terminal answer.
Unicode bidirectional overrides reorder what is displayed ("Trojan Source").  Each such
character is shown instead as ``\\x1b``, ``\\r`` or ``<U+202E>``, so what a person reads
is what the bytes are -- never removed, with what it surrounds: what the person decides on
(a held command, a call's arguments, an exemption) shows every character it holds.
Newlines and tabs stay.  Standard library only: the CLI and the sandboxes' plugins
(``container.run``'s output) both use it.

A test runner's colours are another matter: :func:`strip_sequences` removes a runner's
complete colour and link sequences from its output (``test.run``), where a reporter that
dropped only the escape byte would leave ``[31m`` for the model to read.
"""

from __future__ import annotations

import re

#: C0 controls but tab and newline, DEL, C1 controls, bidi embeddings/overrides/isolates,
#: zero-width and direction marks, the byte-order mark, the line/paragraph separators.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
#: A runner's complete terminal sequences, in their 7-bit form only: CSI (colours, cursor
#: moves: ESC [, parameter, intermediate and final bytes), OSC (a hyperlink, a title: ESC ]
#: up to BEL or ESC \\, within one line and 512 characters) and character-set choices
#: (``ESC ( B``).  The C1 forms (U+009B, U+009D) no runner writes stay tokens.
_SEQUENCE = re.compile(
    r"\x1b\[[0-?]{0,64}[ -/]{0,8}[@-~]"
    r"|\x1b\][^\x07\x1b\n]{0,512}(?:\x07|\x1b\\)"
    r"|\x1b[()*+][0-~]"
)


def strip_sequences(text: str) -> str:
    """A test runner's output without its complete colour and link sequences
    (``\\x1b[31m``, ``\\x1b]8;;url\\x07``); a lone escape character, a cut-off sequence
    and every other control character stay, for :func:`visible` to show.  Never for text a
    person decides on: a sequence there is shown, not removed."""
    return _SEQUENCE.sub("", text)


def _token(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code == 0x0D:
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"<U+{code:04X}>"


def visible(text: str) -> str:
    """``text`` with every character that can hide or rewrite what is shown made visible."""
    return _HIDDEN.sub(_token, text)
