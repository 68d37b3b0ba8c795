"""`fluffy policy check|validate`: the policy engine from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
from rich.markup import escape

from fluffy.cli.render import print_json, stdout
from fluffy.errors import PolicyError

#: Exit codes of `fluffy policy check` (the issue's contract).
EXIT_ALLOW, EXIT_DENY, EXIT_REVIEW, EXIT_BAD_INPUT = 0, 1, 2, 3


class CallerSpec(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    tags: list[str] = []
    container_id: str | None = None
    connection: str | None = None


class TokenSpec(msgspec.Struct, forbid_unknown_fields=True):
    token_id: str
    nonce: int


class RequestSpec(msgspec.Struct, forbid_unknown_fields=True):
    """The JSON a user gives `fluffy policy check --request`."""

    syscall: str
    caller: CallerSpec
    path: str | None = None
    state: str = "idle"
    mode: str = "strict"
    size: int | None = None
    sandbox: str | None = None
    token: TokenSpec | None = None


def _read_request(source: str) -> RequestSpec:
    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
        return msgspec.json.decode(raw, type=RequestSpec)
    except OSError as exc:
        raise PolicyError(
            f"cannot read the request {source}: {exc}",
            why="the request file could not be opened",
            fix="Pass a readable JSON file, or - to read standard input.",
        ) from None
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise PolicyError(
            f"the request in {source} is not valid: {exc}",
            fix='Give JSON like {"syscall": "fs.write", "path": "src/a.py", '
            '"caller": {"name": "tool", "tags": ["core_plugin"]}}.',
            why="a request is a JSON object of the fields the policy engine matches on",
        ) from None


def cmd_policy_check(args: argparse.Namespace) -> int:
    from fluffy.host.policy import (
        Caller,
        PolicyEngine,
        Request,
        TokenUse,
        default_builtins,
        load_policy,
    )

    try:
        policy = load_policy(Path(args.policy))
        spec = _read_request(args.request)
    except PolicyError as error:
        from fluffy.cli.render import print_error

        print_error(error, as_json=args.json)
        return EXIT_BAD_INPUT
    root = Path(args.project).resolve() if args.project else None
    engine = PolicyEngine(policy, builtins=default_builtins(root), root=root)
    request = Request(
        syscall=spec.syscall,
        caller=Caller(
            spec.caller.name,
            frozenset(spec.caller.tags),
            spec.caller.container_id,
            spec.caller.connection,
        ),
        path=spec.path,
        state=spec.state,
        mode=spec.mode,
        size=spec.size,
        sandbox=spec.sandbox,
        token=TokenUse(spec.token.token_id, spec.token.nonce) if spec.token else None,
    )
    decision = engine.evaluate(request)
    report: dict[str, Any] = {
        "decision": decision.result,
        "reasons": decision.reasons,
        "decided_by": decision.decided_by,
        "path": decision.path,
        "matched": [
            {"rule": v.rule, "layer": v.layer, "vote": v.vote, "reason": v.reason}
            for v in decision.matched
        ],
    }
    if args.json:
        print_json(report)
    else:
        color = {"allow": "green", "deny": "red", "require_review": "yellow"}[decision.result]
        by = f" (decided by {escape(decision.decided_by)})" if decision.decided_by else ""
        stdout.print(f"[bold {color}]{decision.result.upper()}[/]{by}")
        for reason in decision.reasons:
            stdout.print(f"  reason: {escape(reason)}")
        for verdict in decision.matched:
            detail = f": {verdict.reason}" if verdict.reason else ""
            stdout.print(
                escape(f"  matched {verdict.rule} [{verdict.layer}] -> {verdict.vote}{detail}")
            )
    return {"allow": EXIT_ALLOW, "deny": EXIT_DENY, "require_review": EXIT_REVIEW}[decision.result]


def cmd_policy_validate(args: argparse.Namespace) -> int:
    from fluffy.host.policy import load_policy, warnings

    try:
        policy = load_policy(Path(args.file))
    except PolicyError as error:
        from fluffy.cli.render import print_error

        print_error(error, as_json=args.json)
        return EXIT_BAD_INPUT
    found = warnings(policy)
    if args.json:
        print(json.dumps({"ok": True, "rules": len(policy.capabilities), "warnings": found}))
    else:
        stdout.print(f"{escape(args.file)}: {len(policy.capabilities)} rule(s), valid")
        for warning in found:
            stdout.print(f"  [yellow]warning:[/] {escape(warning)}")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = sub.add_parser("policy", help="check requests against a policy; validate policies")
    actions = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check", help="evaluate one request (exit 0 allow, 1 deny, 2 require_review, 3 bad input)"
    )
    check.add_argument("--policy", required=True, help="the policy YAML file")
    check.add_argument("--request", required=True, help="request JSON file, or - for stdin")
    check.add_argument("--project", help="project root that paths are confined to")
    check.add_argument("--json", action="store_true")
    check.set_defaults(func=cmd_policy_check)
    validate = actions.add_parser("validate", help="validate a policy file and report warnings")
    validate.add_argument("file")
    validate.add_argument("--json", action="store_true")
    validate.set_defaults(func=cmd_policy_validate)
