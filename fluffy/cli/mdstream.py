"""The model's streamed text as Markdown, one finished block at a time.

The text arrives in small deltas.  Re-rendering all of it on every delta (a Rich
``Live``) flickers, redraws what scrolled away, and costs more the longer the answer
grows; so the deltas are collected and each *finished* block — text up to a blank line
that is not inside a fenced code block — is rendered once, as Markdown, and never
touched again.  What is left when the text ends (a tool call starts, the turn ends) is
rendered then.  A paragraph therefore appears when it is complete, not word by word.

The text is untrusted: it goes through :func:`fluffy.cli.safetext.visible` first (an
escape sequence shows as ``\\x1b``, never reaches the terminal), and links are rendered
as ``text (url)``, never as OSC 8 hyperlinks whose target the person cannot see.
"""

from __future__ import annotations

from rich.markdown import Markdown

from fluffy.safetext import visible

_FENCES = ("```", "~~~")


def split_blocks(text: str) -> tuple[str, str]:
    """``text`` cut after its last finished block: (finished, still open).

    A block is finished by a blank line outside a fenced code block; a fence's closing
    line finishes the code block itself.
    """
    cut = 0
    fence = ""
    position = 0
    seen_text = False
    for line in text.splitlines(keepends=True):
        position += len(line)
        if not line.endswith("\n"):
            break  # the last line is still arriving
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence) and stripped.strip("`~") == "":
                fence = ""
                cut, seen_text = position, False
            continue
        opener = next((f for f in _FENCES if stripped.startswith(f)), "")
        if opener:
            fence = opener
            continue
        if stripped:
            seen_text = True
        elif seen_text:
            cut, seen_text = position, False
    return text[:cut], text[cut:]


class MarkdownStream:
    """Collects deltas; hands back the Markdown of each block once it is finished."""

    def __init__(self, code_theme: str = "ansi_dark") -> None:
        self.code_theme = code_theme
        self.pending = ""

    def feed(self, delta: str) -> Markdown | None:
        """Add ``delta``; the finished blocks so far, if any, to print."""
        self.pending += delta
        done, self.pending = split_blocks(self.pending)
        return self.render(done) if done.strip() else None

    def flush(self) -> Markdown | None:
        """Whatever is left (the text ended), to print."""
        rest, self.pending = self.pending, ""
        return self.render(rest) if rest.strip() else None

    def render(self, text: str) -> Markdown:
        return Markdown(visible(text), code_theme=self.code_theme, hyperlinks=False)
