"""The ``theme`` setting: diff colours for dark and light backgrounds, none when plain."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from fluffy.cli.session_view import SessionRenderer
from fluffy.cli.theme import PALETTES, apply, resolve
from unit import cli_fakes

pytestmark = pytest.mark.unit

COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-9]|4[0-9]|9[0-7])[0-9;]*m")
REVIEW = {
    "type": "review",
    "plan_id": "p",
    "files": ["src/app.py"],
    "diff": "--- a/src/app.py\n+++ b/src/app.py\n@@ -1 +1 @@\n-old\n+new\n",
    "lines": 2,
    "reasons": [],
    "auto": False,
}


@pytest.mark.parametrize(
    ("setting", "env", "expected"),
    [
        ("dark", {"COLORFGBG": "0;15"}, "dark"),
        ("light", {}, "light"),
        ("plain", {}, "plain"),
        ("auto", {}, "dark"),
        ("auto", {"COLORFGBG": "0;15"}, "light"),
        ("auto", {"COLORFGBG": "0;default;7"}, "light"),
        ("auto", {"COLORFGBG": "15;0"}, "dark"),
        ("auto", {"COLORFGBG": "garbage"}, "dark"),
        ("auto", {"NO_COLOR": "1", "COLORFGBG": "0;15"}, "plain"),
    ],
)
def test_auto_reads_the_terminal_background(
    setting: str, env: dict[str, str], expected: str
) -> None:
    assert resolve(setting, env) == expected


def _review(name: str) -> str:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="256", width=80)
    apply(PALETTES[name], console)  # type: ignore[index]
    SessionRenderer(console, palette=PALETTES[name]).render(cli_fakes.shown(REVIEW))  # type: ignore[index]
    return out.getvalue()


def test_dark_and_light_diffs_use_different_colours_and_plain_none() -> None:
    dark, light, plain = _review("dark"), _review("light"), _review("plain")
    assert COLOUR.search(dark) and COLOUR.search(light)
    assert COLOUR.findall(dark) != COLOUR.findall(light)
    assert not COLOUR.search(plain)
    for shown in (dark, light, plain):
        text = re.sub(r"\x1b\[[0-9;]*m", "", shown)
        assert "src/app.py +1 -1" in text and "+new" in text
