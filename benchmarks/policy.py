"""Policy decision latency, beside cedarpy on an equivalent rule set, in one run.

    python -m benchmarks.policy --json [--n 5000]

Paths measured (each p50/p99 in microseconds over ``n`` decisions):
- token fast path: built-in rules + a valid capability token (YAML skipped);
- YAML path with 10, 100 and 1,000 rules on the request's syscall (worst case: every
  rule is looked at, the last one allows);
- cedarpy (Cedar's Python binding) deciding the same request against 1,000 equivalent
  ``permit ... when { resource.path like "dN/*" }`` policies, entities and policy set
  prepared once.
- the extension path: the same engine with one Python extension rule evaluated in the
  real, pre-warmed policy sandbox container over its Unix socket (needs an engine).
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


EXTENSION_RULE = """
def evaluate(request):
    if request["syscall"] == "fs.write" and (request.get("size") or 0) > 50_000:
        return {"vote": "deny", "reason": "too big"}
    return {"vote": "allow", "reason": "ok"}
"""


def extension_path(n: int) -> dict[str, object]:
    """Decisions through the real policy sandbox (a container, over its Unix socket)."""
    import tempfile
    from pathlib import Path

    from fluffy.images.templates import open_manager
    from fluffy.kernel.containers.engine import connect
    from fluffy.kernel.policy.extensions import ExtensionHost

    with tempfile.TemporaryDirectory() as tmp, connect() as engine:
        (Path(tmp) / "rule.py").write_text(EXTENSION_RULE)
        manager = open_manager(engine)
        host = ExtensionHost(manager, Path(tmp))
        started = time.perf_counter()
        host.start()
        start_ms = (time.perf_counter() - started) * 1000
        try:
            policy = PolicyEngine(parse_policy(""), builtins=default_builtins(), extensions=[host])
            request = Request("fs.write", CALLER, path="src/a.py", size=10)
            assert policy.evaluate(request).result == "allow"
            samples = timed(lambda: policy.evaluate(request), n)
        finally:
            host.stop()
            manager.close()
    return {
        "extension_p50_ms": round(percentile(samples, 0.5) / 1000, 3),
        "extension_p99_ms": round(percentile(samples, 0.99) / 1000, 3),
        "extension_start_ms": round(start_ms, 1),
        "extension_engine": f"{engine.info.engine} {engine.info.version}",
    }


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
    result.update(extension_path(min(args.n, 2000)))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:<24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
