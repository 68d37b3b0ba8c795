"""The project's extension rules: names, sizes and syntax checked before anything runs;
written atomically; protected from writes like the policy file; a set that cannot load
denies (fail closed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fluffy.errors import PolicyError
from fluffy.kernel.policy.builtin import default_builtins
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.model import parse_policy
from fluffy.kernel.policy.rules import (
    MAX_RULE_BYTES,
    BrokenRules,
    ProjectRules,
    check_changes,
    read_rules,
    write_rules,
)

RULE = 'def evaluate(request):\n    return {"vote": "pass"}\n'
ALLOW_WRITES = """capabilities:
  - name: writes
    match: {syscall: fs.write}
    action: allow
"""


def test_a_change_is_checked_before_anything_runs() -> None:
    current = {"a.py": RULE}
    assert check_changes(current, {"b.py": RULE, "a.py": None}) == {"b.py": RULE}
    for bad, said in (
        ({"../x.py": RULE}, "not a rule file name"),
        ({"X.py": RULE}, "not a rule file name"),
        ({"a.txt": RULE}, "not a rule file name"),
        ({"gone.py": None}, "no rule gone.py"),
        ({"b.py": "def evaluate(:\n"}, ".fluffy/rules/b.py:1"),
        ({"b.py": "#" * (MAX_RULE_BYTES + 1)}, "bytes; a rule may have"),
        ({"b.py": 3}, "must be a string"),
    ):
        with pytest.raises(PolicyError) as info:
            check_changes(current, bad)
        assert said in info.value.what, (bad, info.value.what)
    with pytest.raises(PolicyError):
        check_changes(current, ["a.py"])


def test_rules_are_written_atomically_and_read_back(tmp_path: Path) -> None:
    folder = tmp_path / ".fluffy" / "rules"
    write_rules(folder, {"a.py": RULE, "b.py": RULE})
    (folder / "notes.txt").write_text("not a rule")
    (folder / "link.py").symlink_to(folder / "a.py")
    assert read_rules(folder) == {"a.py": RULE, "b.py": RULE}  # no links, no other files
    write_rules(folder, {"a.py": None})
    assert sorted(p.name for p in folder.iterdir()) == ["b.py", "link.py", "notes.txt"]


def test_the_rules_folder_is_protected_like_the_policy(tmp_path: Path) -> None:
    engine = PolicyEngine(parse_policy(ALLOW_WRITES), builtins=default_builtins(tmp_path))
    for path in (".fluffy/rules/evil.py", ".FLUFFY/Rules/evil.py", ".fluffy/rules/sub/x.py"):
        decision = engine.evaluate(Request("fs.write", Caller("ai", frozenset({"ai"})), path))
        assert decision.result == "deny", path
        assert decision.decided_by == "builtin:policy-files"
    assert engine.evaluate(Request("fs.write", Caller("ai"), "src/rules.py")).result == "allow"


def test_rules_that_cannot_run_deny_what_they_would_judge(tmp_path: Path) -> None:
    folder = tmp_path / "rules"
    write_rules(folder, {"a.py": RULE})
    rules = ProjectRules(folder, None, tmp_path / "scratch")  # no engine to run them in
    loaded = rules.load()
    assert isinstance(rules.host, BrokenRules) and "no container engine" in rules.host.reason
    engine = PolicyEngine(parse_policy(ALLOW_WRITES), extensions=loaded)
    decision = engine.evaluate(Request("fs.write", Caller("ai"), "src/a.py"))
    assert decision.result == "deny"
    assert "extension rules did not load" in decision.reasons[0]
    assert decision.decided_by == "extension-rules"
    with pytest.raises(PolicyError) as info:
        rules.candidate({"a.py": RULE})
    assert "did not load" in info.value.what
    assert ProjectRules(tmp_path / "none", None, tmp_path).load() == []  # no rules: nothing
