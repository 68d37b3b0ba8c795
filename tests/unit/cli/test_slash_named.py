"""Every slash command a message tells the person to type exists at the prompt."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fluffy.cli import slash

ROOT = Path(__file__).resolve().parents[3]
#: "/word" in a message: after a space, a bracket or a quote; before the same or an end.
NAMED = re.compile(r"(?:^|[\s(`'\"])(/[a-z][a-z_-]*)(?=$|[\s).,;:`'\"])")
#: Words of that shape that are paths or URL parts, never commands.
NOT_COMMANDS = frozenset(
    {"/bin", "/boot", "/build", "/dev", "/docker", "/etc", "/fluffy", "/generated", "/json",
     "/messages", "/output", "/proc", "/run", "/s", "/staged", "/sys", "/tmp",
     "/workspace", "/x", "/fluffy-probe", "/node_modules", "/jest-junit", "/node-test-junit",
     "/prepare", "/index", "/package"}
)  # fmt: skip
#: Other names the prompt accepts.
ALIASES = frozenset({"/exit"})


def _named() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for folder in ("kernel", "fluffy", "sandboxes", "plugins"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.is_relative_to(ROOT / "fluffy" / "ui"):
                continue  # the web view's strings are its URL paths ("/audit"), not commands
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for name in NAMED.findall(node.value):
                        found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_slash_command_named_in_a_message_exists() -> None:
    missing = {
        name: sorted(where)
        for name, where in _named().items()
        if name not in NOT_COMMANDS and name not in slash.COMMANDS and name not in ALIASES
    }
    assert not missing, f"messages name slash commands the prompt does not have: {missing}"


@pytest.mark.parametrize(
    "text", ["Use /cancel to stop.", "(/strict)", "type `/approve`", "or /add-tests."]
)
def test_the_scan_finds_commands_in_messages(text: str) -> None:
    assert NAMED.findall(text)


def test_cancel_asks_the_kernel_and_says_where_the_session_is() -> None:
    calls: list[tuple[str, object]] = []

    class Client:
        def call(self, method: str, params: object) -> dict[str, str]:
            calls.append((method, params))
            return {"mode": "strict", "state": "idle"}

    answer = slash.simple("/cancel", "", Client(), "s1")
    assert calls == [("session.cancel", {"session_id": "s1"})]
    assert answer == "cancelled: mode strict, state idle"
