"""The capability pre-check at registration (design: Capability Pre-check).

Would the policy allow what the plugin says it needs?  Each required capability is asked
of the policy engine for a caller tagged ``third_party``, in every workflow state and
mode (with a sample source and test path for syscalls that take one); each tool the
plugin adds is asked for the AI calling it through a third-party plugin.  Anything the
policy would never allow is a *warning*, shown at install and kept in the registry: the
policy may change later, and every call is still evaluated in full when it happens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from fluffy.kernel.plugins.manifest import PluginManifest
from fluffy.kernel.policy.engine import Caller, Decision, Request
from fluffy.kernel.workflow.states import MODES, STATES

THIRD_PARTY: Final = "third_party"
#: Paths tried for syscalls that act on a path (rules are usually scoped by path_glob).
SAMPLE_PATHS: Final = (None, "src/example.py", "tests/test_example.py")
Evaluate = Callable[[Request], Decision]


def _best(evaluate: Evaluate, syscall: str, caller: Caller, template: str) -> str:
    """The most permissive result the policy gives ``syscall`` anywhere: allow > review."""
    paths = SAMPLE_PATHS if syscall.startswith(("fs.", "search.")) else (None,)
    seen: set[str] = set()
    for state in STATES:
        for mode in MODES:
            for path in paths:
                request = Request(syscall, caller, path, state, mode, sandbox=template)
                seen.add(evaluate(request).result)
                if "allow" in seen:
                    return "allow"
    return "require_review" if "require_review" in seen else "deny"


def precheck(evaluate: Evaluate, manifest: PluginManifest) -> list[str]:
    """Warnings (possibly none) about capabilities and tools the policy would refuse."""
    warnings: list[str] = []
    plugin = Caller(manifest.name, frozenset({THIRD_PARTY}))
    for capability in manifest.required_capabilities:
        result = _best(evaluate, capability, plugin, manifest.sandbox_template)
        if result == "deny":
            warnings.append(
                f"capability {capability}: the current policy denies it to a third_party "
                "plugin in every workflow state"
            )
        elif result == "require_review":
            warnings.append(f"capability {capability}: the current policy requires review")
    ai = Caller(manifest.name, frozenset({"ai", THIRD_PARTY}))
    for tool in manifest.tool_names:
        result = _best(evaluate, tool, ai, manifest.sandbox_template)
        if result != "allow":
            warnings.append(
                f"tool {tool}: no policy rule allows the AI to call it "
                + ("without review" if result == "require_review" else "in any state")
                + f" (add a rule with syscall: {tool} to .fluffy/policy.yaml)"
            )
    return warnings
