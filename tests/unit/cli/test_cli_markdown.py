"""The model's text as Markdown on a terminal, raw when piped; never a raw escape."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from fluffy.cli.mdstream import split_blocks
from fluffy.cli.session_view import SessionRenderer
from unit import cli_fakes

pytestmark = pytest.mark.unit

SGR = re.compile(r"\x1b\[[0-9;]*m")  # colours and bold: what rich itself writes


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, color_system="truecolor", width=80), out


def piped() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, color_system=None, width=80), out


def stream(console: Console, *deltas: str) -> SessionRenderer:
    view = SessionRenderer(console)
    view.render(cli_fakes.shown({"type": "turn_start", "text": "task"}))
    for delta in deltas:
        view.render(cli_fakes.shown({"type": "text_delta", "content": delta}))
    return view


def test_finished_blocks_are_split_off_and_open_fences_are_kept_whole() -> None:
    assert split_blocks("one\n\ntw") == ("one\n\n", "tw")
    assert split_blocks("one line still arriving") == ("", "one line still arriving")
    code = "```py\nx = 1\n\ny = 2\n"
    assert split_blocks(code) == ("", code)  # a blank line inside a fence ends nothing
    closed = code + "```\nafter"
    assert split_blocks(closed) == (code + "```\n", "after")
    assert split_blocks("\n\n\n") == ("", "\n\n\n")  # nothing but blank lines


def test_on_a_terminal_the_text_is_rendered_as_markdown() -> None:
    console, out = terminal()
    view = stream(console, "# Plan\n\nThis is **very** ", "important:\n\n- one\n- two\n")
    view.close()
    shown = out.getvalue()
    text = SGR.sub("", shown)
    assert "**very**" not in text and "very important" in text
    assert "# Plan" not in text and "Plan" in text
    assert "• one" in text and "• two" in text
    assert "\x1b[1m" in shown  # bold


def test_when_piped_the_text_stays_raw() -> None:
    console, out = piped()
    view = stream(console, "This is **very** ", "important.\n\n- one\n")
    view.close()
    assert "AI: This is **very** important.\n\n- one\n" in out.getvalue()


def test_a_paragraph_appears_when_it_is_finished_not_before() -> None:
    console, out = terminal()
    view = stream(console, "First para", "graph.\n")
    assert "First" not in out.getvalue()
    view.render(cli_fakes.shown({"type": "text_delta", "content": "\nSecond"}))
    assert "First paragraph." in SGR.sub("", out.getvalue())
    assert "Second" not in out.getvalue()
    view.render(cli_fakes.shown({"type": "tool_executing", "call_id": "c", "tool_name": "fs.read"}))
    done = {"type": "tool_result", "call_id": "c", "tool_name": "fs.read", "summary": "ok"}
    view.render(cli_fakes.shown({**done, "ok": True}))
    text = SGR.sub("", out.getvalue())
    assert text.index("Second") < text.index("  fs.read...")  # the rest, before the tool's line


def test_escapes_and_hyperlinks_in_the_models_markdown_never_reach_the_terminal() -> None:
    console, out = terminal()
    hostile = (
        "See [the docs](http://evil.example/x) and "
        "\x1b]8;;http://evil.example/y\x1b\\click\x1b]8;;\x1b\\ or \x1b[2J\x1b]0;pwned\x07.\n\n"
        "```\n\x1b[1A\x1b[2K+ assert True\n```\n"
    )
    view = stream(console, hostile)
    view.close()
    shown = out.getvalue()
    assert "\x1b]" not in shown  # no OSC at all: no hyperlink, no window title
    assert "\x07" not in shown and "\x1b[2J" not in shown and "\x1b[1A" not in shown
    assert not SGR.sub("", shown).count("\x1b")  # every escape left is rich's own styling
    text = SGR.sub("", shown)
    assert "http://evil.example/x" in text  # a link's target is shown, not hidden
    assert "\\x1b]8;;http://evil.example/y" in text and "\\x1b[1A\\x1b[2K+ assert True" in text


def test_the_answer_is_not_repeated_at_the_end() -> None:
    console, out = terminal()
    view = stream(console, "All **done**.")
    view.render(cli_fakes.shown({"type": "turn_end", "status": "done", "text": "All **done**."}))
    text = SGR.sub("", out.getvalue())
    assert text.count("All done.") == 1 and "Done." in text
