"""The meta-policy: validate in memory, trial replay, [BREAKING], phrase, atomic write."""

from __future__ import annotations

from pathlib import Path

import pytest

from fluffy.errors import PolicyError
from fluffy.kernel.policy.builtin import default_builtins
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.meta import (
    CONFIRM_PHRASE,
    apply_update,
    plan_update,
)
from fluffy.kernel.policy.model import load_policy, parse_policy

OLD = """capabilities:
  - name: write-src
    match: {syscall: fs.write, path_glob: ["src/**"]}
    action: allow
  - name: read-all
    match: {syscall: fs.read}
    action: allow
"""
TOOL = Caller("tool", frozenset())


def engine(text: str = OLD) -> PolicyEngine:
    return PolicyEngine(parse_policy(text), builtins=default_builtins())


def history(n: int) -> list[Request]:
    return [Request("fs.write", TOOL, path=f"src/f{i}.py") for i in range(n)] + [
        Request("fs.read", TOOL, path="README.md")
    ]


def test_only_changed_results_are_listed_and_breaking_ones_marked() -> None:
    new = OLD.replace('["src/**"]', '["src/f1.py", "src/f2.py"]')
    plan = plan_update(engine(), new, history(4))
    assert [c.line() for c in plan.changes] == [
        "[BREAKING] fs.write src/f0.py by tool: allow -> deny",
        "[BREAKING] fs.write src/f3.py by tool: allow -> deny",
    ]
    assert plan.breaking == 2 and not plan.needs_phrase


def test_the_model_s_decisions_are_counted_apart() -> None:
    ai = Caller("ai", frozenset({"ai"}))
    tried = [*history(3), Request("fs.write", ai, path="src/x.py"), Request("fs.read", ai, "a")]
    plan = plan_update(engine(), OLD.replace("src/**", "lib/**"), tried)
    assert (plan.tried, plan.ai_tried) == (6, 2)
    assert plan.breaking == 4 and plan.ai_changed == 1  # src/f0..f2 and the model's x.py
    assert plan.changes[-1].line() == "[BREAKING] fs.write src/x.py by the model: allow -> deny"
    fs_tool = Caller("fs-tool", frozenset({"ai", "core_plugin"}))
    change = plan_update(engine(), "capabilities: []", [Request("fs.write", fs_tool, "src/y")])
    assert change.changes[0].line().endswith("by fs-tool for the model: allow -> deny")


def test_an_invalid_new_policy_is_refused_before_anything_changes(tmp_path: Path) -> None:
    path = tmp_path / ".fluffy" / "policy.yaml"
    path.parent.mkdir()
    path.write_text(OLD)
    with pytest.raises(PolicyError) as info:
        plan_update(
            engine(),
            "capabilities:\n  - name: x\n    action: allow\n",
            history(1),
            source=str(path),
        )
    assert "capabilities.0.match" in info.value.what
    assert path.read_text() == OLD


def test_review_and_phrase_are_required(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(OLD)
    plan = plan_update(engine(), "capabilities: []", history(8))
    assert plan.breaking == 9 and plan.needs_phrase  # 8 writes and the read
    with pytest.raises(PolicyError, match="not approved"):
        apply_update(path, plan, reviewed=False)
    with pytest.raises(PolicyError, match="confirmation phrase"):
        apply_update(path, plan, reviewed=True, phrase="yes")
    assert path.read_text() == OLD
    apply_update(path, plan, reviewed=True, phrase=CONFIRM_PHRASE)
    assert load_policy(path).capabilities == []
    assert [p.name for p in tmp_path.iterdir()] == ["policy.yaml"]  # no temp file left


def test_policy_update_itself_always_needs_review() -> None:
    d = engine().evaluate(Request("policy.update", TOOL))
    assert d.result == "require_review" and d.decided_by is None
    assert "human review" in d.reasons[0]
