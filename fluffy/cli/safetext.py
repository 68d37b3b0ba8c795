"""Text from models and sandboxes on the terminal: :class:`SafeConsole` prints no raw
control character from any text (:func:`fluffy.safetext.visible` makes them visible)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from fluffy.safetext import visible


class SafeConsole(Console):
    """A Rich console whose ``print`` shows no raw control character from any text."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(visible(o) if isinstance(o, str) else o for o in objects), **kwargs)
