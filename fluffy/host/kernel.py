"""The kernel process itself (``fluffy kernel serve`` runs it in the foreground)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluffy.host import lazy

if TYPE_CHECKING:
    from fluffy.kernel.serve import main

_FROM = {
    "main": "fluffy.kernel.serve",
}
__all__ = [
    "main",
]
__getattr__ = lazy(__name__, _FROM)
