"""Load-time warnings about a policy (``fluffy policy validate``).

They do not block start-up (the policy means what it says); they point at rules that
cannot do what their author probably meant.
"""

from __future__ import annotations

from fluffy.kernel.policy.engine import READ_ONLY
from fluffy.kernel.policy.model import MATCH_FIELDS, PolicyFile, Rule

#: Syscalls for which an unconditional allow is the usual rule, not an oversight: they
#: read the project (the built-in rules still refuse secret files and paths outside
#: it) or ask the person, who decides.  `fluffy init` writes such allows.
READS_OR_ASKS = READ_ONLY | {
    "git.status",
    "git.diff",
    "workflow.request_exemption",
    "workflow.add_tests",
    "workflow.request_mode",
}


def warnings(policy: PolicyFile) -> list[str]:
    found: list[str] = []
    for rule in policy.capabilities:
        if rule.match.path_glob == []:
            found.append(
                f"rule {rule.name}: path_glob is an empty list, which matches no "
                "path: the rule never applies"
            )
        for item in rule.except_:
            if item == rule.match:
                found.append(
                    f"rule {rule.name}: an except condition is identical to the "
                    "match, so the rule never triggers"
                )
        if rule.match.syscall is None:
            found.append(f"rule {rule.name}: no syscall in match: it is checked for every request")
    found.extend(_blanket(policy))
    denies = [r for r in policy.capabilities if r.action == "deny" and not r.except_]
    for rule in policy.capabilities:
        if rule.action == "deny":
            continue
        for deny in denies:
            if _broader(deny.match, rule.match):
                found.append(
                    f"rule {rule.name}: shadowed by the broader deny rule "
                    f"{deny.name}; it can never allow"
                )
                break
    return found


def _broader(outer: object, inner: object) -> bool:
    """Whether every request ``inner`` matches is matched by ``outer`` (conservative)."""
    for field in MATCH_FIELDS:
        o = getattr(outer, field)
        i = getattr(inner, field)
        if o is None:
            continue
        if i is None or not set(i) <= set(o):
            return False
    return True


def _unconditional(rule: Rule) -> bool:
    """A rule whose only condition is its syscall, with no except and no constraints."""
    match = rule.match
    return (
        not rule.except_
        and rule.constraints is None
        and all(
            getattr(match, field) is None
            for field in (
                "path_glob",
                "caller_tag",
                "plugin",
                "state_machine_state",
                "session_mode",
                "command",
            )
        )
    )


def _blanket(policy: PolicyFile) -> list[str]:
    """Syscalls for which every request is denied, or every request allowed."""
    found: list[str] = []
    syscalls = sorted({s for r in policy.capabilities for s in r.match.syscall or ()})
    for syscall in syscalls:
        rules = [r for r in policy.capabilities if syscall in (r.match.syscall or ())]
        if any(r.action == "deny" and _unconditional(r) for r in rules):
            found.append(f"syscall {syscall}: every request is denied (an unconditional deny)")
        elif (
            syscall not in READS_OR_ASKS
            and any(r.action == "allow" and _unconditional(r) for r in rules)
            and not any(r.action in ("deny", "require_review") for r in rules)
        ):
            found.append(
                f"syscall {syscall}: every request is allowed (an unconditional allow "
                "and no deny or review rule)"
            )
    return found
