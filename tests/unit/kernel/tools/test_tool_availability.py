"""Tool availability per workflow state and mode (the design's TDD table, as data)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fluffy.errors import ToolUnavailable, WorkflowError
from fluffy.kernel.tools.routing.availability import (
    TEST_RUN_STATES,
    WriteScope,
    available,
    check,
)
from fluffy.kernel.workflow.evidence import DEFAULT_TEST_GLOBS
from fluffy.kernel.workflow.states import MODES, STATES, TABLES, flow_of


@dataclass(frozen=True)
class Tool:
    name: str
    kind: str


TOOLS = [
    Tool("fs.read", "read"),
    Tool("fs.list", "read"),
    Tool("fs.exists", "read"),
    Tool("search.grep", "read"),
    Tool("search.glob", "read"),
    Tool("git.status", "read"),
    Tool("git.diff", "read"),
    Tool("fs.write", "write"),
    Tool("fs.edit", "write"),
    Tool("test.run", "execute"),
    Tool("container.run", "execute"),
    Tool("git.commit", "commit"),
    Tool("plan.complete", "workflow"),
    Tool("workflow.request_exemption", "workflow"),
    Tool("workflow.add_tests", "workflow"),
]
READS = {t.name for t in TOOLS if t.kind == "read"}


def pairs() -> list[tuple[str, str]]:
    """Every (state, mode) a session can be in: each mode's flow, plus exempted strict."""
    found: set[tuple[str, str]] = set()
    for mode in MODES:
        for exempted in (False, True):
            table = TABLES[flow_of(mode, exempted)]  # type: ignore[arg-type]
            for (origin, _), transition in table.items():
                found |= {(origin, mode), (transition.to, mode)}
    return sorted(found)


def test_pairs_cover_every_state_in_every_mode_that_can_reach_it() -> None:
    found = pairs()
    assert {s for s, _ in found} == set(STATES)
    assert ("test_writing", "explore") not in found  # explore never enters strict states
    assert ("exploring", "strict") in found  # a granted exemption


# Expected writability of sample paths, per state (the design's table completed).
SAMPLES = {
    "src/app.py": "source",
    "README.md": "source",
    "pkg/sub/mod.py": "source",
    "tests/test_app.py": "test",
    "test/helpers.py": "test",
    "pkg/test_mod.py": "test",
    "pkg/mod_test.py": "test",
    "conftest.py": "test",
    ".fluffy/policy.yaml": "protected",
    ".git/config": "protected",
}
WRITES = {
    "test_writing": {"test"},
    "code_writing": {"source"},
    "exploring": {"source", "test"},
    "retroactive_testing": {"test"},
}


@pytest.mark.parametrize(("state", "mode"), pairs())
def test_reads_are_available_in_every_state(state: str, mode: str) -> None:
    assert set(available(state, mode, TOOLS)) >= READS
    for name in READS:
        check(name, "read", state, mode, ["anything/at/all.py"], TOOLS)


@pytest.mark.parametrize(("state", "mode"), pairs())
def test_writes_follow_the_tdd_table(state: str, mode: str) -> None:
    allowed = WRITES.get(state, set())
    for path, category in SAMPLES.items():
        if category in allowed:
            check("fs.write", "write", state, mode, [path], TOOLS)
        else:
            with pytest.raises(ToolUnavailable) as caught:
                check("fs.write", "write", state, mode, [path], TOOLS)
            error = caught.value
            assert error.tool_name == "fs.write" and error.current_state == state
            assert error.available_tools == available(state, mode, TOOLS)
            assert error.reason and state in error.reason
    assert ("fs.write" in available(state, mode, TOOLS)) == bool(allowed)


@pytest.mark.parametrize(("state", "mode"), pairs())
def test_execute_and_commit_follow_the_state(state: str, mode: str) -> None:
    names = set(available(state, mode, TOOLS))
    assert ("test.run" in names) == (
        state in {"test_writing", "code_writing", "validating", "exploring", "retroactive_testing"}
    )
    assert ("container.run" in names) == (mode == "debug" and "test.run" in names)
    assert ("git.commit" in names) == (state == "committing")
    assert ("plan.complete" in names) == (state == "planning")
    # the AI asks the user where the state machine could act on the answer
    assert ("workflow.request_exemption" in names) == (state in {"planning", "test_writing"})
    assert ("workflow.add_tests" in names) == (state == "reviewing")
    for tool in TOOLS:
        if tool.name in names:
            check(tool.name, tool.kind, state, mode, [], TOOLS)  # type: ignore[arg-type]
        else:
            with pytest.raises(ToolUnavailable):
                check(tool.name, tool.kind, state, mode, [], TOOLS)  # type: ignore[arg-type]


def test_test_run_states_match_the_brief() -> None:
    assert {"validating", "exploring"} <= TEST_RUN_STATES
    assert not {"idle", "planning", "reviewing", "committing"} & TEST_RUN_STATES


def test_available_is_sorted_and_unique() -> None:
    names = available("exploring", "debug", [*TOOLS, Tool("fs.read", "read")])
    assert names == sorted(set(names)) and names.count("fs.read") == 1


def test_the_reason_names_the_rule_the_path_and_the_next_step() -> None:
    with pytest.raises(ToolUnavailable) as caught:
        check("fs.write", "write", "test_writing", "strict", ["src/app.py"], TOOLS)
    error = caught.value
    assert "test_writing allows writes to test files only" in error.reason
    assert "tests/**" in error.reason
    assert "src/app.py is a source file" in error.reason
    assert "then move to code_writing" in error.reason
    data = error.to_dict()
    assert data["error"] == "tool_unavailable" and data["current_state"] == "test_writing"
    # fs.write stays available (for test paths); git.commit is not.
    assert {"fs.write", "test.run"} <= set(data["available_tools"])
    assert "git.commit" not in data["available_tools"]


def test_code_writing_says_tests_are_read_only() -> None:
    with pytest.raises(ToolUnavailable, match=r"fs\.edit is not available") as caught:
        check("fs.edit", "write", "code_writing", "strict", ["tests/test_app.py"], TOOLS)
    assert "tests are read-only" in caught.value.reason
    assert "tests/test_app.py is a test file" in caught.value.reason


def test_every_path_of_a_call_is_checked() -> None:
    with pytest.raises(ToolUnavailable) as caught:
        check(
            "fs.write",
            "write",
            "test_writing",
            "strict",
            ["tests/test_a.py", "src/a.py", "src/b.py"],
            TOOLS,
        )
    assert "src/a.py" in caught.value.reason and "1 more path" in caught.value.reason


def test_commit_outside_committing_explains_where_it_runs() -> None:
    with pytest.raises(ToolUnavailable) as caught:
        check("git.commit", "commit", "reviewing", "strict", [""], TOOLS)
    assert "git.commit is available only in committing" in caught.value.reason
    assert "Wait for the merge decision" in caught.value.reason


@pytest.mark.parametrize("path", ["../outside.py", "/etc/passwd", "", ".", "tests/../../x"])
def test_paths_outside_the_project_or_the_whole_project_are_never_writable(path: str) -> None:
    with pytest.raises(ToolUnavailable):
        check("fs.write", "write", "exploring", "explore", [path], TOOLS)


def test_dotted_paths_are_normalised_before_matching() -> None:
    check("fs.write", "write", "test_writing", "strict", ["./tests/x/../test_a.py"], TOOLS)
    with pytest.raises(ToolUnavailable):
        check("fs.write", "write", "test_writing", "strict", ["tests/../src/a.py"], TOOLS)


def test_test_globs_agree_with_evidence() -> None:
    scope = WriteScope()
    assert scope.test_globs == DEFAULT_TEST_GLOBS
    for path, category in SAMPLES.items():
        if category != "protected":
            assert scope.is_test(path) == (category == "test"), path


def test_configured_globs_are_used() -> None:
    scope = WriteScope(test_globs=["spec/**"], protected_globs=[".fluffy/**", "secrets/**"])
    check("fs.write", "write", "test_writing", "strict", ["spec/a_spec.rb"], TOOLS, scope=scope)
    with pytest.raises(ToolUnavailable):
        check("fs.write", "write", "test_writing", "strict", ["tests/t.py"], TOOLS, scope=scope)
    with pytest.raises(ToolUnavailable) as caught:
        check("fs.write", "write", "exploring", "debug", ["secrets/k.pem"], TOOLS, scope=scope)
    assert "protected paths (.fluffy/**, secrets/**)" in caught.value.reason


def test_unknown_states_or_modes_are_a_bug_not_a_refusal() -> None:
    with pytest.raises(WorkflowError, match="unknown workflow state"):
        available("dreaming", "strict", TOOLS)
    with pytest.raises(WorkflowError):
        check("fs.read", "read", "idle", "yolo", [], TOOLS)


@pytest.mark.parametrize(
    "path", [".FLUFFY/policy.yaml", ".Fluffy/config.yaml", ".fluffY/rules/x.py", ".GIT/config"]
)
def test_fluffys_own_folder_is_protected_in_any_case(path: str) -> None:
    """A case-insensitive file system (macOS, Windows) opens `.FLUFFY/policy.yaml` as
    `.fluffy/policy.yaml`: every check refuses it whatever its case."""
    from fluffy.kernel.confined_files import ProtectedPaths
    from fluffy.kernel.policy.builtin import default_builtins
    from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
    from fluffy.kernel.policy.model import PolicyFile
    from fluffy.kernel.tools.routing.availability import WriteScope

    assert WriteScope().is_protected(path)
    assert ProtectedPaths().matches(path)
    if "policy" in path:
        engine = PolicyEngine(PolicyFile(), builtins=default_builtins())
        decision = engine.evaluate(Request("fs.write", Caller("ai"), path=path))
        assert decision.result == "deny" and "builtin:policy-files" in decision.decided_by
