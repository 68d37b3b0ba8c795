"""The project's MCP server records: what is refused on the way in, how a record that
cannot be read as one is reported (never half-used), and the policy's say on MCP
syscalls (unmatched: review; a family rule; the protected folder)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fluffy.errors import McpServerInvalid, PolicyError
from fluffy.kernel.mcp.record import (
    check_name,
    load_records,
    parse_record,
    remove_record,
    save_record,
)
from fluffy.kernel.policy.builtin import default_builtins
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.model import PolicyFile, parse_policy
from tests.unit.mcp_support import fake_server


def test_a_record_round_trips_and_is_removed(tmp_path: Path) -> None:
    path = save_record(tmp_path, fake_server("time"))
    assert path == tmp_path / ".fluffy" / "mcp" / "time.json"
    servers, problems = load_records(tmp_path)
    assert list(servers) == ["time"] and not problems
    assert servers["time"].tool_names() == [
        "mcp.time.echo",
        "mcp.time.crash",
        "mcp.time.sleep",
        "mcp.time.fail",
    ]
    assert remove_record(tmp_path, "time") and not remove_record(tmp_path, "time")
    assert load_records(tmp_path) == ({}, {})


@pytest.mark.parametrize("name", ["Time", "-x", "a_b", "x" * 40, "", "a.b", "time-"])
def test_bad_names_are_refused_with_what_to_use(name: str) -> None:
    with pytest.raises(McpServerInvalid) as caught:
        check_name(name)
    assert "lower-case letters" in caught.value.fix


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"command": []}, "command"),
        ({"command": ["ok", "bad\x1b[2J"]}, "control characters"),
        ({"env": {"PATH": "/evil"}}, "cannot be set"),
        ({"env": {"FLUFFY_MCP_SOCKET": "/x"}}, "cannot be set"),
        ({"image": "debian:latest"}, "image"),
        ({"tools": [{"name": "a b"}]}, "tools"),
        ({"tools": [{"name": "a", "input_schema": {"type": "string"}}]}, "must describe an object"),
        ({"tools": [{"name": "a"}, {"name": "a"}]}, "same name"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_a_record_with_a_bad_field_does_not_load(change: dict[str, object], problem: str) -> None:
    data = fake_server("time").model_dump(mode="json")
    data.update(change)
    with pytest.raises(McpServerInvalid) as caught:
        parse_record(json.dumps(data).encode(), ".fluffy/mcp/time.json")
    assert problem in caught.value.why
    assert "fluffy mcp add" in caught.value.fix


def test_records_that_cannot_be_read_as_one_are_problems_not_servers(tmp_path: Path) -> None:
    save_record(tmp_path, fake_server("good"))
    folder = tmp_path / ".fluffy" / "mcp"
    (folder / "broken.json").write_text("{not json")
    (folder / "renamed.json").write_text((folder / "good.json").read_text())  # says "good"
    outside = tmp_path / "outside.json"
    outside.write_text((folder / "good.json").read_text())
    os.symlink(outside, folder / "linked.json")
    servers, problems = load_records(tmp_path)
    assert list(servers) == ["good"]
    assert set(problems) == {"broken.json", "renamed.json", "linked.json"}
    assert "names the server 'good'" in problems["renamed.json"]


def test_a_linked_records_folder_is_not_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    save_record(elsewhere, fake_server("x"))
    (tmp_path / "project" / ".fluffy").mkdir(parents=True)
    os.symlink(elsewhere / ".fluffy" / "mcp", tmp_path / "project" / ".fluffy" / "mcp")
    servers, problems = load_records(tmp_path / "project")
    assert not servers and ".fluffy/mcp" in problems


def _decide(
    policy: PolicyFile, syscall: str, path: str | None = None, root: Path | None = None
) -> tuple[str, str | None]:
    engine = PolicyEngine(policy, builtins=default_builtins(root) if root else (), root=root)
    request = Request(syscall=syscall, caller=Caller("ai", frozenset({"ai"})), path=path,
                      state="planning", mode="strict")  # fmt: skip
    decision = engine.evaluate(request)
    return decision.result, decision.decided_by


FAMILY = """capabilities:
  - name: time-tools
    match: {syscall: ["mcp.time.*"]}
    action: allow
  - name: no-convert
    match: {syscall: mcp.time.convert_time}
    action: deny
"""


def test_an_mcp_syscall_no_rule_speaks_of_needs_review_others_stay_denied() -> None:
    assert _decide(PolicyFile(), "mcp.time.get_current_time")[0] == "require_review"
    assert _decide(PolicyFile(), "fs.write", "a.py")[0] == "deny"
    policy = parse_policy(FAMILY, "policy.yaml")
    assert _decide(policy, "mcp.time.get_current_time") == ("allow", "time-tools")
    assert _decide(policy, "mcp.time.convert_time") == ("deny", "no-convert")
    assert _decide(policy, "mcp.timer.start")[0] == "require_review"  # not the family
    assert _decide(policy, "mcp.time")[0] == "require_review"


@pytest.mark.parametrize("bad", ["*", "mcp.*.x", "mcp*", ".*", " mcp.x.*"])
def test_a_syscall_pattern_other_than_a_trailing_family_is_refused(bad: str) -> None:
    text = f'capabilities:\n  - name: r\n    match: {{syscall: ["{bad}"]}}\n    action: allow\n'
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "policy.yaml")
    assert "not a syscall name" in caught.value.why


def test_the_records_folder_is_protected_like_the_policy(tmp_path: Path) -> None:
    everything = parse_policy(
        "capabilities:\n  - name: all\n    match: {syscall: [fs.write, fs.delete]}\n"
        "    action: allow\n",
        "policy.yaml",
    )
    for path in (".fluffy/mcp/time.json", ".fluffy/mcp", ".FLUFFY/MCP/x.json"):
        result, by = _decide(everything, "fs.write", path, tmp_path)
        assert result == "deny" and by is not None and by.startswith("builtin:"), path
