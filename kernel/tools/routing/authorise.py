"""The policy's say on a tool call, before anything runs.

The paths a call names (a write's path with symlinks resolved: a link to the policy *is*
the policy), the size a write leaves its file at (for ``max_file_size``), and the
policy request for each path: denied, held for review, or allowed.  A write in a
sandbox is checked before its capability token is issued (ADR-041).
"""

from __future__ import annotations

from typing import Any

from fluffy.errors import MergeRefused, PolicyDenied, ToolInputInvalid
from fluffy.kernel.confined_files import safe_relpath
from fluffy.kernel.policy.audited import AuditedPolicy, request_data
from fluffy.kernel.policy.engine import Caller, Request
from fluffy.kernel.tools.changes.workspace import Workspaces
from fluffy.kernel.tools.core.capabilities import Scope
from fluffy.kernel.tools.core.registry import ToolSpec
from fluffy.kernel.tools.core.routedcall import RoutedCall
from fluffy.kernel.tools.reading.fastpath import FastPath
from fluffy.kernel.tools.routing.commandrun import TOOL as COMMAND_TOOL
from fluffy.kernel.tools.routing.commandrun import command_argv


def write_path(fast: FastPath, raw: Any) -> str:
    if not isinstance(raw, str):
        raise ToolInputInvalid("`path` must be a string")
    rel = fast.rel(raw)  # symlinks resolved: a link to the policy *is* the policy
    try:
        return safe_relpath(rel)
    except MergeRefused as exc:
        raise ToolInputInvalid(f"cannot write {raw!r}", why=exc.why, fix=exc.fix) from None


def call_paths(fast: FastPath, spec: ToolSpec, args: Any) -> tuple[frozenset[str], frozenset[str]]:
    """What a call reads and what it writes."""
    if not isinstance(args, dict):
        raise ToolInputInvalid(f"{spec.name}: arguments must be an object")
    reads, writes = spec.paths(args)
    if spec.kind == "write":
        rel = write_path(fast, args.get("path"))
        return frozenset({rel}), frozenset({rel})
    if spec.kind == "read" and (spec.name.startswith("fs.") or "path" in args):
        # the policy sees what is read (search.grep's folder too)
        return frozenset({fast.rel(str(args.get("path", ".")))}), frozenset()
    return reads, writes


def authorise(
    call: RoutedCall, asked: list[dict[str, Any]], *, policy: AuditedPolicy, size: int | None
) -> None:
    """The policy's say on each path the call names (``size``: what a write leaves its
    file at); ``asked`` gets each request (as data: the meta-policy trial replays them
    from the call's audit entry)."""
    spec = call.spec
    if spec.route == "plugin" and spec.plugin:
        caller = Caller(spec.plugin, frozenset({"ai", "core_plugin"}))
    elif spec.route == "mcp" and spec.plugin:  # an MCP server: third-party code
        caller = Caller(spec.plugin, frozenset({"ai", "mcp", "third_party"}))
    else:
        caller = Caller("ai", frozenset({"ai"}))
    named = [p for p in sorted(call.writes) if p] or [
        p for p in sorted(call.reads) if p not in ("", ".")
    ]
    targets: list[str | None] = [*named] or [None]  # None: the whole project
    command = command_argv(call.args) if spec.name == COMMAND_TOOL else None
    # a write in a sandbox is checked before its token is issued (ADR-041): every
    # change the sandbox returns is then checked against the token
    issuing = spec.route == "plugin" and spec.kind == "write" and bool(call.writes)
    if issuing:
        call.capability = Scope(spec.name, tuple(sorted(call.writes)))
    for path in targets:
        request = Request(
            syscall=spec.name,
            caller=caller,
            path=path if path not in (None, ".") else None,
            state=call.session.state,
            mode=call.session.mode,
            size=size,
            sandbox=spec.template if spec.route in ("plugin", "mcp") else None,
            issuing=issuing,
            command=command,
        )
        asked.append(request_data(policy.as_evaluated(request)))
        decision = policy.evaluate(request)
        if decision.result == "allow" and decision.decided_by:
            rules = (call.rule or "").split(",") if call.rule else []
            call.rule = ",".join(dict.fromkeys([*rules, decision.decided_by]))
        if decision.result == "deny":
            by = decision.decided_by  # the rule's name: the user knows what to change
            raise PolicyDenied(
                f"policy denied {spec.name}" + (f" on {path}" if path else ""),
                why=("; ".join(decision.reasons) or "no rule allows it (default deny)")
                + (f" (rule {by})" if by else ""),
                fix=denied_fix(by),
            )
        if decision.result == "require_review":
            if spec.kind == "external" or command is not None:  # asked before it runs
                call.review = "; ".join(decision.reasons) or f"{spec.name} needs review"
                continue
            if spec.kind != "write":
                raise PolicyDenied(
                    f"{spec.name} needs the user's review",
                    why="; ".join(decision.reasons),
                    fix="Only writes can wait for review (in reviewing); ask the user.",
                )
            call.review = "; ".join(decision.reasons) or f"{spec.name} {path} needs review"


def size_after(call: RoutedCall, fast: FastPath, workspaces: Workspaces) -> int | None:
    """The size a write leaves its file at (for max_file_size); None: not a write."""
    args = call.args
    if call.spec.kind != "write":
        return None
    if call.spec.name == "fs.delete":
        return 0
    if isinstance(args.get("content"), str):
        return len(args["content"].encode())
    found = fast.content(next(iter(call.writes)), workspaces.get(call.session.id))
    old, new = args.get("old_string"), args.get("new_string")
    if found is None or not isinstance(old, str) or not isinstance(new, str):
        return None
    # arithmetic, never the edited text: 20 KB of matches times a 100 KB replacement
    # would build gigabytes in the kernel before the policy could refuse the size
    text = found[0].decode("utf-8", "replace")
    matches = text.count(old) if old else len(text) + 1
    if not args.get("replace_all"):
        matches = min(matches, 1)
    return len(found[0]) + matches * (len(new.encode()) - len(old.encode()))


def denied_fix(rule: str | None) -> str:
    """Where the refusing rule lives, so the user knows what to change."""
    if rule is not None and rule.startswith("ext:"):
        return (
            f"The project's extension rule {rule[4:]} (.fluffy/rules) refuses it: ask the "
            "user to change the rule (fluffy config rules set), or do something else."
        )
    if rule is not None and rule.startswith("builtin:"):
        return "A built-in rule protects this; no policy allows it. Do something else."
    return (
        "Ask the user to allow it in .fluffy/policy.yaml (fluffy config policy edit), or "
        "do something else."
    )
