"""Sessions at rest: the state database's sessions without a kernel, scripted turns."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluffy.host import lazy

if TYPE_CHECKING:
    from fluffy.kernel.ai.memory import sessions_at_rest
    from fluffy.kernel.ai.script import Expect, SessionScript, load_script, load_turns

_FROM = {
    "load_script": "fluffy.kernel.ai.script",
    "SessionScript": "fluffy.kernel.ai.script",
    "Expect": "fluffy.kernel.ai.script",
    "load_turns": "fluffy.kernel.ai.script",
    "sessions_at_rest": "fluffy.kernel.ai.memory",
}
__all__ = [
    "Expect",
    "SessionScript",
    "load_script",
    "load_turns",
    "sessions_at_rest",
]
__getattr__ = lazy(__name__, _FROM)
