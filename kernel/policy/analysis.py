"""Load-time warnings about a policy (``fluffy policy validate``).

They do not block start-up (the policy means what it says); they point at rules that
cannot do what their author probably meant.
"""

from __future__ import annotations

from fluffy.kernel.policy.model import PolicyFile


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
    for field in (
        "syscall",
        "path_glob",
        "caller_tag",
        "plugin",
        "state_machine_state",
        "session_mode",
    ):
        o = getattr(outer, field)
        i = getattr(inner, field)
        if o is None:
            continue
        if i is None or not set(i) <= set(o):
            return False
    return True
