"""The ``theme`` setting: colours for dark or light terminal backgrounds, or none.

``auto`` (the default) asks the terminal: ``NO_COLOR`` set means ``plain``; otherwise
``COLORFGBG`` (``"15;0"``: foreground;background, set by rxvt, Konsole, iTerm2 and
others) names the background colour — 7 or 9-15 is a light background, anything else a
dark one; without it, ``dark``.  ``plain`` prints no colour at all (bold and the like
stay, so the layout still reads).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from rich.console import Console

Resolved = Literal["dark", "light", "plain"]
_LIGHT_BACKGROUNDS: Final = frozenset({7, *range(9, 16)})


@dataclass(frozen=True)
class Palette:
    """What a theme decides: the diff and code colours, and whether there is colour."""

    name: Resolved
    syntax: str  # Rich syntax theme of diffs and of code blocks in the model's Markdown
    added: str  # style of a review's "+N" count
    removed: str  # style of its "-N" count
    color: bool = True


PALETTES: Final[Mapping[Resolved, Palette]] = {
    "dark": Palette("dark", "ansi_dark", "green", "red"),
    "light": Palette("light", "ansi_light", "dark_green", "dark_red"),
    "plain": Palette("plain", "ansi_dark", "", "", color=False),
}


def resolve(setting: str, env: Mapping[str, str] | None = None) -> Resolved:
    """The theme to use for ``setting`` (auto | dark | light | plain)."""
    env = os.environ if env is None else env
    for fixed in ("dark", "light", "plain"):
        if setting == fixed:
            return fixed
    if env.get("NO_COLOR"):
        return "plain"
    background = env.get("COLORFGBG", "").split(";")[-1].strip()
    if background.isdigit() and int(background) in _LIGHT_BACKGROUNDS:
        return "light"
    return "dark"


def palette(setting: str, env: Mapping[str, str] | None = None) -> Palette:
    return PALETTES[resolve(setting, env)]


def apply(chosen: Palette, *consoles: Console) -> None:
    """Make ``consoles`` print without colour when the palette has none."""
    for console in consoles:
        console.no_color = not chosen.color
