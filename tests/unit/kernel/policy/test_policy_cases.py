"""The design's 26 normative policy test cases, one named test each."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from fluffy.kernel.policy.analysis import warnings
from fluffy.kernel.policy.engine import (
    BuiltinRule,
    Caller,
    Decision,
    EvalContext,
    PolicyEngine,
    Request,
    Verdict,
)
from fluffy.kernel.policy.model import parse_policy
from fluffy.kernel.policy.tokens import TokenStore, TokenUse

ME = Caller("tool", frozenset({"core_plugin"}), container_id="c1", connection="conn1")


def engine(
    yaml_text: str = "capabilities: []",
    *,
    builtins: Sequence[BuiltinRule] = (),
    extensions: Sequence[Callable[[Request], Iterable[Verdict]]] = (),
    tokens: TokenStore | None = None,
    clock: Callable[[], float] = lambda: 1000.0,
) -> PolicyEngine:
    return PolicyEngine(
        parse_policy(yaml_text),
        builtins=builtins,
        extensions=extensions,
        tokens=tokens,
        clock=clock,
    )


def write(path: str = "src/a.py", **kw: object) -> Request:
    return Request("fs.write", kw.pop("caller", ME), path=path, **kw)  # type: ignore[arg-type]


ALLOW_SRC = """
  - name: allow-src
    match: {syscall: fs.write, path_glob: ["src/**"]}
    action: allow
"""
DENY_SRC = """
  - name: deny-src
    match: {syscall: fs.write, path_glob: ["src/**"]}
    action: deny
    reason: "src is frozen"
"""
REVIEW_SRC = """
  - name: review-src
    match: {syscall: fs.write, path_glob: ["src/**"]}
    action: require_review
    reason: "src changes need review"
"""


def policy(*rules: str) -> str:
    return "capabilities:" + "".join(rules) if rules else "capabilities: []"


def builtin_vote(vote: str, name: str = "builtin:test") -> BuiltinRule:
    def rule(request: Request, ctx: EvalContext) -> Verdict | None:
        return Verdict(name, "builtin", vote, f"{name} says {vote}")  # type: ignore[arg-type]

    return rule


def extension_vote(vote: str, calls: list[int] | None = None) -> Callable[[Request], list[Verdict]]:
    def rule(request: Request) -> list[Verdict]:
        if calls is not None:
            calls.append(1)
        return [Verdict("ext:test", "extension", vote, f"extension says {vote}")]  # type: ignore[arg-type]

    return rule


def token_engine(
    yaml_text: str = "capabilities: []", **kw: object
) -> tuple[PolicyEngine, TokenUse]:
    store = TokenStore()
    token = store.issue(
        container_id="c1",
        connection="conn1",
        syscall="fs.write",
        path_glob=("src/**",),
        max_ops=2,
        now=1000.0,
        ttl_s=30.0,
    )
    return engine(yaml_text, tokens=store, **kw), TokenUse(token.token_id, 1)  # type: ignore[arg-type]


def rule_votes(decision: Decision) -> dict[str, str]:
    return {v.rule: v.vote for v in decision.matched}


# --- Basic semantics (1-6) --------------------------------------------------------------
def test_01_no_rules_match_is_default_deny() -> None:
    d = engine(policy(ALLOW_SRC)).evaluate(write("docs/readme.md"))
    assert d.result == "deny" and d.reasons == ["no rule explicitly allowed this operation"]


def test_02_only_pass_rules_is_default_deny() -> None:
    passing = """
  - name: abstain
    match: {syscall: fs.write}
    action: pass
"""
    d = engine(policy(passing)).evaluate(write())
    assert d.result == "deny" and rule_votes(d) == {"abstain": "pass"}


def test_03_allow_and_deny_on_the_same_syscall_is_deny() -> None:
    d = engine(policy(ALLOW_SRC, DENY_SRC)).evaluate(write())
    assert d.result == "deny" and d.decided_by == "deny-src" and d.reasons == ["src is frozen"]


def test_04_allow_and_require_review_is_require_review() -> None:
    d = engine(policy(ALLOW_SRC, REVIEW_SRC)).evaluate(write())
    assert d.result == "require_review" and d.reasons == ["src changes need review"]


def test_05_extension_deny_beats_builtin_allow() -> None:
    d = engine(builtins=[builtin_vote("allow")], extensions=[extension_vote("deny")]).evaluate(
        write()
    )
    assert d.result == "deny" and d.decided_by == "ext:test"
    assert rule_votes(d)["builtin:test"] == "allow"  # allow did not short-circuit


def test_06_require_review_whose_except_matches_is_pass() -> None:
    rule = """
  - name: new-employee-review
    match: {syscall: fs.write, caller_tag: [new_employee]}
    action: require_review
    except:
      - {path_glob: ["src/tests/**"]}
"""
    newbie = Caller("tool", frozenset({"new_employee"}), "c1", "conn1")
    d = engine(policy(rule, ALLOW_SRC)).evaluate(write("src/tests/t.py", caller=newbie))
    assert rule_votes(d)["new-employee-review"] == "pass" and d.result == "allow"


# --- Token path (7-9, 21-23) ------------------------------------------------------------
def test_07_valid_token_with_builtin_deny_is_deny() -> None:
    eng, use = token_engine(builtins=[builtin_vote("deny")])
    assert eng.evaluate(write(token=use)).result == "deny"


def test_08_valid_token_without_builtin_issues_is_allow_and_skips_yaml() -> None:
    eng, use = token_engine(policy(DENY_SRC))
    d = eng.evaluate(write(token=use))
    assert d.result == "allow" and d.by_token and d.audit_decision == "allowed_by_token"
    assert "deny-src" not in rule_votes(d)


def test_09_expired_token_falls_through_to_full_evaluation() -> None:
    eng, use = token_engine(policy(ALLOW_SRC), clock=lambda: 1030.0)  # expires at 1030
    d = eng.evaluate(write(token=use))
    assert d.result == "allow" and not d.by_token and d.decided_by == "allow-src"
    eng2, use2 = token_engine(policy(DENY_SRC), clock=lambda: 5000.0)
    assert eng2.evaluate(write(token=use2)).result == "deny"


def test_21_token_with_max_ops_used_up_falls_through() -> None:
    eng, use = token_engine(policy(DENY_SRC))
    assert eng.evaluate(write(token=TokenUse(use.token_id, 1))).by_token
    assert eng.evaluate(write(token=TokenUse(use.token_id, 2))).by_token
    d = eng.evaluate(write(token=TokenUse(use.token_id, 3)))  # max_ops=2
    assert d.result == "deny" and not d.by_token and d.decided_by == "deny-src"


def test_22_ttl_boundary_uses_one_time_snapshot_taken_at_the_start() -> None:
    times = iter([1029.999, 1030.5, 1031.0, 2000.0])  # later reads would be past expiry
    calls: list[float] = []

    def clock() -> float:
        value = next(times)
        calls.append(value)
        return value

    eng, use = token_engine(policy(DENY_SRC), clock=clock)
    d = eng.evaluate(write(token=use))
    assert d.result == "allow" and d.by_token
    assert calls == [1029.999]  # read once, at the start


def test_23_token_for_another_container_is_invalid() -> None:
    eng, use = token_engine(policy(DENY_SRC))
    other = Caller("tool", frozenset({"core_plugin"}), container_id="c2", connection="conn1")
    d = eng.evaluate(write(token=use, caller=other))
    assert d.result == "deny" and not d.by_token


def test_token_replay_with_an_old_nonce_is_refused() -> None:
    eng, use = token_engine(policy(DENY_SRC))
    assert eng.evaluate(write(token=TokenUse(use.token_id, 5))).by_token
    assert not eng.evaluate(write(token=TokenUse(use.token_id, 5))).by_token


# --- Except mechanism (13-15, 26) -------------------------------------------------------
MULTI_EXCEPT = """
  - name: review-writes
    match: {syscall: fs.write}
    action: require_review
    reason: "writes need review"
    except:
      - {path_glob: ["tests/**"]}
      - {caller_tag: [trusted_write]}
"""


def test_13_require_review_whose_except_does_not_match_is_require_review() -> None:
    d = engine(policy(MULTI_EXCEPT, ALLOW_SRC)).evaluate(write("src/a.py"))
    assert d.result == "require_review"


def test_14_one_of_several_except_conditions_matches_is_pass() -> None:
    trusted = Caller("tool", frozenset({"trusted_write"}), "c1", "conn1")
    d = engine(policy(MULTI_EXCEPT, ALLOW_SRC)).evaluate(write("src/a.py", caller=trusted))
    assert rule_votes(d)["review-writes"] == "pass" and d.result == "allow"


def test_15_none_of_several_except_conditions_match_is_require_review() -> None:
    d = engine(policy(MULTI_EXCEPT)).evaluate(write("docs/x.md"))
    assert d.result == "require_review" and d.reasons == ["writes need review"]


def test_26_except_identical_to_match_never_triggers_and_warns() -> None:
    text = policy(
        """
  - name: self-cancelling
    match: {syscall: fs.write, path_glob: ["src/**"]}
    action: deny
    except:
      - {syscall: fs.write, path_glob: ["src/**"]}
""",
        ALLOW_SRC,
    )
    d = engine(text).evaluate(write())
    assert d.result == "allow" and rule_votes(d)["self-cancelling"] == "pass"
    assert any("identical to the match" in w for w in warnings(parse_policy(text)))


# --- Aggregation (10-12, 16-17) ---------------------------------------------------------
def test_10_multiple_require_review_reasons_are_all_aggregated() -> None:
    other = REVIEW_SRC.replace("review-src", "review-two").replace("need review", "need a 2nd look")
    d = engine(policy(REVIEW_SRC, other, ALLOW_SRC)).evaluate(write())
    assert d.result == "require_review"
    assert sorted(d.reasons) == ["src changes need a 2nd look", "src changes need review"]


def test_11_yaml_deny_short_circuits_before_extensions_run() -> None:
    calls: list[int] = []
    d = engine(policy(DENY_SRC), extensions=[extension_vote("allow", calls)]).evaluate(write())
    assert d.result == "deny" and calls == []


def test_12_partial_match_does_not_apply_the_rule() -> None:
    d = engine(policy(DENY_SRC)).evaluate(write("tests/t.py"))
    assert "deny-src" not in rule_votes(d) and d.reasons == [
        "no rule explicitly allowed this operation"
    ]


def test_16_multiple_allows_without_deny_or_review_is_allow() -> None:
    second = ALLOW_SRC.replace("allow-src", "allow-py").replace('"src/**"', '"*.py"')
    d = engine(policy(ALLOW_SRC, second)).evaluate(write())
    assert d.result == "allow" and set(rule_votes(d)) == {"allow-src", "allow-py"}


def test_17_allow_across_yaml_and_extension_is_allow() -> None:
    d = engine(policy(ALLOW_SRC), extensions=[extension_vote("allow")]).evaluate(write())
    assert d.result == "allow" and rule_votes(d) == {"allow-src": "allow", "ext:test": "allow"}


# --- Defensive boundaries (18-20, 24-25) ------------------------------------------------
def test_18_no_builtin_rules_still_works() -> None:
    d = engine(policy(ALLOW_SRC), builtins=[]).evaluate(write())
    assert d.result == "allow"


def test_19_empty_yaml_file_is_default_deny_with_builtins_active() -> None:
    eng = engine("", builtins=[builtin_vote("pass")])
    d = eng.evaluate(write())
    assert d.result == "deny" and rule_votes(d) == {"builtin:test": "pass"}


def test_20_extension_crash_is_deny() -> None:
    def crashing(request: Request) -> list[Verdict]:
        raise RuntimeError("policy sandbox died")

    d = engine(policy(ALLOW_SRC), extensions=[crashing]).evaluate(write())
    assert d.result == "deny" and "extension rule failed" in d.reasons[0]


def test_24_unknown_syscall_is_default_deny() -> None:
    d = engine(policy(ALLOW_SRC)).evaluate(Request("quantum.entangle", ME))
    assert d.result == "deny" and d.matched == []


def test_25_empty_path_glob_matches_no_path_and_warns() -> None:
    text = policy("""
  - name: nothing
    match: {syscall: fs.write, path_glob: []}
    action: allow
""")
    assert engine(text).evaluate(write()).result == "deny"
    assert any("empty list" in w for w in warnings(parse_policy(text)))


# --- beyond the 26 ----------------------------------------------------------------------
def test_a_rule_that_fails_during_evaluation_is_a_deny_never_a_skip() -> None:
    def broken(request: Request, ctx: EvalContext) -> Verdict | None:
        raise ValueError("bug")

    d = engine(policy(ALLOW_SRC), builtins=[broken]).evaluate(write())
    assert d.result == "deny" and "rule failed" in d.reasons[0]


def test_paths_escaping_the_project_are_denied_by_a_builtin(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "link").symlink_to("/etc")
    eng = PolicyEngine(parse_policy(policy(ALLOW_SRC)), root=tmp_path)
    for path in ("../x", "src/../../x", "/etc/passwd", "src/link/passwd"):
        d = eng.evaluate(write(path))
        assert d.result == "deny" and d.decided_by == "builtin:path-confinement", path
    assert eng.evaluate(write(str(tmp_path / "src" / "ok.py"))).result == "allow"


def test_a_link_to_the_policy_file_is_judged_as_the_policy_file(tmp_path: Path) -> None:
    from fluffy.kernel.policy.builtin import default_builtins

    (tmp_path / ".fluffy").mkdir()
    (tmp_path / ".fluffy" / "policy.yaml").write_text("capabilities: []\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "innocent.py").symlink_to("../.fluffy/policy.yaml")
    (tmp_path / "src" / "loop").symlink_to("loop")
    eng = PolicyEngine(
        parse_policy(policy(ALLOW_SRC)), builtins=default_builtins(tmp_path), root=tmp_path
    )
    d = eng.evaluate(write("src/innocent.py"))
    assert d.result == "deny" and d.decided_by == "builtin:policy-files"
    assert d.path == ".fluffy/policy.yaml"
    looped = eng.evaluate(write("src/loop"))
    assert looped.result == "deny" and looped.decided_by == "builtin:path-confinement"


def test_constraints_are_not_met_by_unknowns() -> None:
    text = policy("""
  - name: small-l2-writes
    match: {syscall: fs.write}
    action: allow
    constraints: {require_sandbox: L2, max_file_size: "1KiB"}
""")
    eng = engine(text)
    assert eng.evaluate(write(size=10, sandbox="code-executor")).result == "allow"
    assert eng.evaluate(write(sandbox="code-executor")).result == "deny"  # size unknown
    assert eng.evaluate(write(size=10, sandbox="L1")).result == "deny"
    assert eng.evaluate(write(size=10)).result == "deny"
    assert eng.evaluate(write(size=5000, sandbox="code-executor")).result == "deny"
