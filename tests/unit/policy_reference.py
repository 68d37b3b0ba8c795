"""A deliberately tiny reference evaluator, written straight from the design's rules.

No index, no compiled globs, no token fast path: every rule is looked at, in order,
with pathspec built on the spot.  The real engine must always agree with it.
"""

from __future__ import annotations

import fnmatch
import shlex

from fluffy.kernel.globs import GlobSet
from fluffy.kernel.policy.engine import Request
from fluffy.kernel.policy.model import Match, PolicyFile

L2 = {"ai-provider", "code-executor", "policy-sandbox", "integration-test"}


def command_matches(pattern: str, argv: tuple[str, ...] | None) -> bool:
    """Word by word; a last ``**`` takes any further arguments."""
    if argv is None:
        return False
    words = shlex.split(pattern)
    if words[-1] == "**":
        words, argv = words[:-1], argv[: len(words) - 1] if len(argv) >= len(words) - 1 else None
        if argv is None:
            return False
    return len(words) == len(argv) and all(
        fnmatch.fnmatchcase(a, w) for w, a in zip(words, argv, strict=True)
    )


def matches(m: Match, request: Request, path: str | None) -> bool:
    checks = [
        m.syscall is None or request.syscall in m.syscall,
        m.path_glob is None or (path is not None and GlobSet(m.path_glob).match(path)),
        m.caller_tag is None or bool(set(m.caller_tag) & request.caller.tags),
        m.plugin is None or request.caller.name in m.plugin,
        m.state_machine_state is None or request.state in m.state_machine_state,
        m.session_mode is None or request.mode in m.session_mode,
        m.command is None or any(command_matches(p, request.command) for p in m.command),
    ]
    return all(checks)


def reference_decision(policy: PolicyFile, request: Request, path: str | None) -> str:
    votes = []
    for rule in policy.capabilities:
        if not matches(rule.match, request, path):
            continue
        if any(matches(e, request, path) for e in rule.except_):
            votes.append("pass")
            continue
        action = rule.action
        c = rule.constraints
        if (
            action == "allow"
            and c is not None
            and (
                c.require_capability_token
                or (c.require_sandbox == "L2" and request.sandbox not in L2)
                or (c.require_sandbox not in (None, "L2") and request.sandbox != c.require_sandbox)
                or (
                    c.max_file_bytes is not None
                    and (request.size is None or request.size > c.max_file_bytes)
                )
            )
        ):
            action = "deny"
        votes.append(action)
    if "deny" in votes:
        return "deny"
    if "require_review" in votes:
        return "require_review"
    if "allow" in votes:
        return "allow"
    if request.syscall == "container.run":  # a command no rule allows asks the person
        return "require_review"
    return "deny"
