"""The project's extension rules: names, sizes and syntax checked before anything runs;
written atomically; protected from writes like the policy file; a set that cannot load
denies (fail closed)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fluffy.errors import PolicyError
from fluffy.kernel.policy.builtin import default_builtins
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request, Verdict
from fluffy.kernel.policy.model import parse_policy
from fluffy.kernel.policy.rules import (
    MAX_RULE_BYTES,
    BrokenRules,
    ProjectRules,
    check_changes,
    read_rules,
    write_rules,
)

ROOT = Path(__file__).resolve().parents[4]
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
    assert read_rules(folder) == {"a.py": RULE, "b.py": RULE}  # other files are not rules
    write_rules(folder, {"a.py": None})
    assert sorted(p.name for p in folder.iterdir()) == ["b.py", "notes.txt"]


@pytest.mark.parametrize("case", ["link", "fifo", "bad name", "too big", "linked folder"])
def test_a_rule_that_cannot_be_read_makes_the_set_fail_closed(tmp_path: Path, case: str) -> None:
    """A rule that silently vanished (a link git stored, a FIFO, a name the update path
    could never remove) would leave the set running as if complete: it is refused, and
    the kernel denies what the rules would judge, saying why."""
    import os

    real = tmp_path / "real"
    write_rules(real, {"deny.py": RULE})
    folder = tmp_path / "rules"
    write_rules(folder, {"a.py": RULE})
    if case == "link":
        (folder / "shared.py").symlink_to(real / "deny.py")
    elif case == "fifo":
        os.mkfifo(folder / "pipe.py")
    elif case == "bad name":
        (folder / "Bad Name.py").write_text(RULE)
    elif case == "too big":
        (folder / "big.py").write_text("#" * (MAX_RULE_BYTES + 1))
    else:
        folder = tmp_path / "linked"
        folder.symlink_to(real)
    with pytest.raises(PolicyError) as info:
        read_rules(folder)
    assert "extension rules cannot be read" in info.value.what
    rules = ProjectRules(folder, None, tmp_path / "scratch")
    loaded = rules.load()
    assert isinstance(rules.host, BrokenRules) and loaded == [rules.host]
    engine = PolicyEngine(parse_policy(ALLOW_WRITES), extensions=loaded)
    assert engine.evaluate(Request("fs.write", Caller("ai"), "src/a.py")).result == "deny"
    if case == "linked folder":
        with pytest.raises(PolicyError):
            rules.install({"x.py": RULE}, None)
        assert not (real / "x.py").exists()  # never written through the link


def test_a_huge_or_deep_change_is_refused_cheaply(tmp_path: Path) -> None:
    many = {f"r{i}.py": RULE for i in range(5000)}
    with pytest.raises(PolicyError) as info:
        check_changes({}, many)  # counted before anything is compiled
    assert "5000 rules" in info.value.what
    with pytest.raises(PolicyError) as deep:
        check_changes({}, {"deep.py": "x = a" + ".b" * 30000})
    assert "too deeply nested" in deep.value.what or "deep.py" in deep.value.what


def test_the_rules_folder_is_protected_like_the_policy(tmp_path: Path) -> None:
    engine = PolicyEngine(parse_policy(ALLOW_WRITES), builtins=default_builtins(tmp_path))
    for path in (
        ".fluffy/rules/evil.py",
        ".FLUFFY/Rules/evil.py",
        ".fluffy/rules/sub/x.py",
        ".fluffy/rules",
        ".fluffy",
    ):
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


class SlowHost:
    """Stands in for the policy sandbox (its start takes a while; no container)."""

    live: list[SlowHost] = []
    began: list[SlowHost] = []  # starts under way (a test waits for one, not a fixed time)

    def __init__(self, manager: object, folder: Path) -> None:
        self.rules_dir = folder
        self.running = False
        self.__name__ = "extension-rules"

    def start(self) -> None:
        import time

        SlowHost.began.append(self)
        time.sleep(0.5)
        self.running = True
        SlowHost.live.append(self)

    def stop(self) -> None:
        self.running = False

    def __call__(self, request: Request) -> Iterator[Verdict]:
        return iter(())


async def _kernel(tmp_path: Path) -> tuple[Any, Any, Any, Path]:
    from fluffy.kernel.audit.entry import Event
    from fluffy.kernel.audit.log import AuditLog
    from fluffy.kernel.policy.audited import AuditedPolicy
    from fluffy.kernel.syscalls.policy import policy_methods

    project = tmp_path / "p"
    (project / ".fluffy").mkdir(parents=True)
    text = (ROOT / "examples" / "policies" / "default.yaml").read_text()
    (project / ".fluffy" / "policy.yaml").write_text(text)
    state = tmp_path / "s"
    state.mkdir()
    audit = await AuditLog.open(state)
    await audit.record(Event("kernel_start"))
    engine = PolicyEngine(parse_policy(text), builtins=default_builtins(project), root=project)
    front = AuditedPolicy(engine, audit)
    rules = ProjectRules(project / ".fluffy" / "rules", lambda: object(), state / "rules")  # type: ignore[arg-type,return-value]
    methods = policy_methods(
        front, project / ".fluffy" / "policy.yaml", state, audit, None, None, rules
    )
    return methods["policy.update"], front, audit, state


CLI = SimpleNamespace(binding="cli", plugin_name="")
PASS = "def evaluate(request):\n    return None\n"


def test_overlapping_updates_each_apply_on_what_is_in_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rules change (slow: its sandbox starts) and a deny added meanwhile: both stay
    in force (the rules change is planned on the policy with the deny)."""
    from fluffy.kernel.policy import rules as rules_module

    monkeypatch.setattr(rules_module, "ExtensionHost", SlowHost)

    async def main() -> None:
        update, front, audit, _ = await _kernel(tmp_path)
        read = Request("fs.read", Caller("ai", frozenset({"ai"})), "src/secret.py")
        assert front.evaluate(read).result == "allow"
        text = (tmp_path / "p" / ".fluffy" / "policy.yaml").read_text()
        deny = text + (
            "\n  - name: no-secret-reads\n    match: {syscall: fs.read, "
            'path_glob: ["src/secret.py"]}\n    action: deny\n'
        )
        slow = asyncio.create_task(update(CLI, {"rules": {"a.py": PASS}, "approve": True}))
        await asyncio.sleep(0.1)
        assert (await update(CLI, {"text": deny, "approve": True}))["applied"]
        assert (await slow)["applied"]
        assert front.evaluate(read).result == "deny"  # the deny survived the rules swap
        await audit.close()

    asyncio.run(main())


def test_a_caller_hanging_up_leaves_no_policy_sandbox_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fluffy.kernel.policy import rules as rules_module

    monkeypatch.setattr(rules_module, "ExtensionHost", SlowHost)
    SlowHost.live.clear()
    SlowHost.began.clear()

    async def main() -> None:
        update, _, audit, state = await _kernel(tmp_path)
        await update(CLI, {"rules": {"a.py": PASS}})  # a plan: its sandbox is stopped
        task = asyncio.create_task(update(CLI, {"rules": {"b.py": PASS}}))
        for _ in range(200):  # until the candidate's start is under way
            if len(SlowHost.began) == 2:
                break
            await asyncio.sleep(0.02)
        assert len(SlowHost.began) == 2
        task.cancel()  # the connection dropped while the candidate was starting
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            if len(SlowHost.live) == 2 and not any(h.running for h in SlowHost.live):
                break
            await asyncio.sleep(0.1)
        assert [h.running for h in SlowHost.live] == [False, False]
        assert not list((state / "rules").iterdir())  # nor its staged rules
        await audit.close()

    asyncio.run(main())
