"""The tool layer's host-side parts: the plugin home, the test views."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluffy.host import lazy

if TYPE_CHECKING:
    from fluffy.kernel.tools.sandbox.plugin_activation import open_home
    from fluffy.kernel.tools.testing.testview import TestViews

_FROM = {
    "open_home": "fluffy.kernel.tools.sandbox.plugin_activation",
    "TestViews": "fluffy.kernel.tools.testing.testview",
}
__all__ = [
    "TestViews",
    "open_home",
]
__getattr__ = lazy(__name__, _FROM)
