"""Policy decision latency, beside cedarpy on an equivalent rule set, in one run.

    python -m benchmarks.policy --json [--n 5000]

Paths measured (each p50/p99 in microseconds over ``n`` decisions):
- token fast path: built-in rules + a valid capability token (YAML skipped);
- YAML path with 10, 100 and 1,000 rules on the request's syscall (worst case: every
  rule is looked at, the last one allows);
- cedarpy (Cedar's Python binding) deciding the same request against 1,000 equivalent
  ``permit ... when { resource.path like "dN/*" }`` policies, entities and policy set
  prepared once.
The extension path needs the policy sandbox host, which is not built yet: reported as
null (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable

from benchmarks._stats import percentile
from fluffy.kernel.policy.builtin import default_builtins
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.model import parse_policy
from fluffy.kernel.policy.tokens import TokenStore, TokenUse

CALLER = Caller("tool", frozenset({"core_plugin"}), container_id="c1", connection="k1")


def policy_text(rules: int) -> str:
    body = "".join(
        f'  - name: allow-{n}\n    match: {{syscall: fs.write, path_glob: ["d{n}/**"]}}\n'
        "    action: allow\n"
        for n in range(rules)
    )
    return "capabilities:\n" + body


def timed(fn: Callable[[], object], n: int) -> list[float]:
    for _ in range(min(200, n)):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.policy")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args(argv)
    result: dict[str, object] = {"n": args.n}

    for rules in (10, 100, 1000):
        engine = PolicyEngine(parse_policy(policy_text(rules)), builtins=default_builtins())
        request = Request("fs.write", CALLER, path=f"d{rules - 1}/file.py")
        assert engine.evaluate(request).result == "allow"
        samples = timed(lambda e=engine, r=request: e.evaluate(r), args.n)
        result[f"yaml_{rules}_p50_us"] = round(percentile(samples, 0.5), 1)
        result[f"yaml_{rules}_p99_us"] = round(percentile(samples, 0.99), 1)

    store = TokenStore()
    token = store.issue(
        container_id="c1",
        connection="k1",
        syscall="fs.write",
        path_glob=("d0/**",),
        max_ops=10**9,
        now=time.monotonic(),
        ttl_s=3600,
    )
    engine = PolicyEngine(
        parse_policy(policy_text(1000)), builtins=default_builtins(), tokens=store
    )
    nonces = itertools.count(1)

    def with_token() -> object:
        use = TokenUse(token.token_id, next(nonces))
        decision = engine.evaluate(Request("fs.write", CALLER, path="d0/file.py", token=use))
        assert decision.by_token
        return decision

    samples = timed(with_token, args.n)
    result["token_p50_us"] = round(percentile(samples, 0.5), 1)
    result["token_p99_us"] = round(percentile(samples, 0.99), 1)

    import cedarpy

    policies = "\n".join(
        f'permit(principal, action == Action::"fs.write", resource) '
        f'when {{ resource.path like "d{n}/*" }};'
        for n in range(1000)
    )
    policy_set = cedarpy.PolicySet.from_str(policies)
    entities = cedarpy.Entities.from_json_str(
        json.dumps(
            [
                {
                    "uid": {"type": "File", "id": "f"},
                    "attrs": {"path": "d999/file.py"},
                    "parents": [],
                },
                {"uid": {"type": "User", "id": "tool"}, "attrs": {}, "parents": []},
            ]
        )
    )
    cedar_request = {
        "principal": 'User::"tool"',
        "action": 'Action::"fs.write"',
        "resource": 'File::"f"',
        "context": {},
    }
    assert cedarpy.is_authorized(cedar_request, policy_set, entities).decision.name == "Allow"
    samples = timed(lambda: cedarpy.is_authorized(cedar_request, policy_set, entities), args.n)
    result["cedarpy_1000_p50_us"] = round(percentile(samples, 0.5), 1)
    result["cedarpy_1000_p99_us"] = round(percentile(samples, 0.99), 1)
    result["ratio_vs_cedarpy_p50"] = round(
        float(result["yaml_1000_p50_us"]) / float(result["cedarpy_1000_p50_us"]),
        3,  # type: ignore[arg-type]
    )
    result["extension_p50_ms"] = None
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:<24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
