"""Policy files: load and check them, the engine's verdict on a request, the allow-list."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluffy.host import lazy

if TYPE_CHECKING:
    from fluffy.kernel.net.allowlist import AllowList, Rule
    from fluffy.kernel.policy.analysis import warnings
    from fluffy.kernel.policy.builtin import default_builtins
    from fluffy.kernel.policy.engine import (
        Caller,
        PolicyEngine,
        Request,
    )
    from fluffy.kernel.policy.model import (
        PolicyFile,
        load_policy,
        parse_policy,
    )
    from fluffy.kernel.policy.tdd_settings import CATEGORIES
    from fluffy.kernel.policy.tokens import TokenUse

_FROM = {
    "AllowList": "fluffy.kernel.net.allowlist",
    "Caller": "fluffy.kernel.policy.engine",
    "CATEGORIES": "fluffy.kernel.policy.tdd_settings",
    "default_builtins": "fluffy.kernel.policy.builtin",
    "load_policy": "fluffy.kernel.policy.model",
    "parse_policy": "fluffy.kernel.policy.model",
    "PolicyEngine": "fluffy.kernel.policy.engine",
    "PolicyFile": "fluffy.kernel.policy.model",
    "Request": "fluffy.kernel.policy.engine",
    "Rule": "fluffy.kernel.net.allowlist",
    "TokenUse": "fluffy.kernel.policy.tokens",
    "warnings": "fluffy.kernel.policy.analysis",
}
__all__ = [
    "CATEGORIES",
    "AllowList",
    "Caller",
    "PolicyEngine",
    "PolicyFile",
    "Request",
    "Rule",
    "TokenUse",
    "default_builtins",
    "load_policy",
    "parse_policy",
    "warnings",
]
__getattr__ = lazy(__name__, _FROM)
