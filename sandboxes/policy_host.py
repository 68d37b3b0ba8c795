"""The policy sandbox's host: evaluates Python extension rules for the kernel.

Runs as ``python3 -m fluffy.sandboxes.policy_host`` in a long-lived ``policy-sandbox``
container (strict seccomp, no network, read-only root).  It loads every ``*.py`` in
``/workspace`` (the extension rules, mounted read-only), connects to the kernel's socket
for this sandbox, drops ``execve`` from its own seccomp filter, then loops: take the next
job (``policy.next``), run every rule, report (``policy.verdict``).

A rule file defines ``evaluate(request: dict) -> dict | list[dict] | None``; each dict is
``{"vote": "allow"|"deny"|"require_review"|"pass", "reason": str}``; ``None`` abstains.
``NAME`` names the rule (default: the file name).  A rule that raises or returns anything
else votes deny: a failing rule is never skipped.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RULES_DIR = Path("/workspace")
SOCKET = "/run/fluffy/kernel.sock"
VOTES = frozenset({"allow", "deny", "require_review", "pass"})

Rule = tuple[str, Callable[[dict[str, Any]], Any]]


def load_rules(folder: Path) -> list[Rule]:
    rules: list[Rule] = []
    names = sorted(p.name for p in folder.iterdir())  # raises if unreadable: never silent
    for path in (folder / name for name in names if name.endswith(".py")):
        namespace: dict[str, Any] = {"__name__": f"fluffy_rule_{path.stem}"}
        exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - sandboxed
        evaluate = namespace.get("evaluate")
        if not callable(evaluate):
            raise SystemExit(f"{path.name}: defines no evaluate(request) function")
        rules.append((str(namespace.get("NAME", path.stem)), evaluate))
    return rules


def run_rules(rules: list[Rule], request: dict[str, Any]) -> list[dict[str, str]]:
    verdicts: list[dict[str, str]] = []
    for name, evaluate in rules:
        try:
            answer = evaluate(dict(request))
        except Exception as exc:
            verdicts.append(
                {"rule": name, "vote": "deny", "reason": f"rule raised {type(exc).__name__}: {exc}"}
            )
            continue
        items = answer if isinstance(answer, list) else [] if answer is None else [answer]
        for item in items:
            if not isinstance(item, dict) or item.get("vote") not in VOTES:
                verdicts.append(
                    {"rule": name, "vote": "deny", "reason": f"rule returned {item!r}, not a vote"}
                )
                continue
            verdicts.append(
                {"rule": name, "vote": item["vote"], "reason": str(item.get("reason", ""))[:500]}
            )
    return verdicts


def main() -> int:
    from fluffy.ipc.client import SyncClient
    from fluffy.sandboxes.tighten import tighten

    rules = load_rules(RULES_DIR)
    client = SyncClient(SOCKET, plugin_name="policy-sandbox", timeout=None)
    tighten("strict")  # no execve from here on
    while True:
        job = client.call("policy.next")
        if job is None:
            return 0
        try:
            verdicts = run_rules(rules, job["request"])
        except Exception:
            traceback.print_exc(file=sys.stderr)
            verdicts = [{"rule": "policy-host", "vote": "deny", "reason": "host failed"}]
        client.call("policy.verdict", {"job": job["job"], "verdicts": verdicts})


if __name__ == "__main__":
    raise SystemExit(main())
