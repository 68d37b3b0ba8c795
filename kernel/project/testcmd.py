"""A project's own test command (``.fluffy/config.yaml``, ``tests:``) instead of pytest.

::

    tests:
      # vitest / jest-junit / go test + go-junit-report / cargo nextest ...
      command: ["npx", "vitest", "run", "--reporter=junit", "--outputFile={junit}"]
      env: {JEST_JUNIT_OUTPUT_FILE: "{junit}"}   # optional
      junit: "{junit}"                           # where the command writes its JUnit XML

or only the variables the tests need, for the runner fluffy picks (pytest, vitest, jest,
node's own)::

    tests:
      env: {TZ: America/New_York}

The command runs in the test sandbox with the project's view read-only at /workspace
(its working directory), no network, and these placeholders filled in: ``{junit}`` (a
writable path fluffy reads the report from), ``{coverage}`` (one for a coverage file),
``{paths}`` (the paths the model asked for; appended at the end when absent).  The TDD
evidence is read from the JUnit XML: a ``<failure>`` counts as a failing assertion, an
``<error>`` does not -- in a JavaScript project, the report is read as a JavaScript
runner's (mocha's ``--reporter xunit`` too: the failure's class or its stack says whether
it is an assertion, a case's ``file`` or its stack which test file it is in).
``.fluffy/`` is protected: the model can never change this.  But a repository the person
cloned can ship it, and the command writes the report that decides what is green: the
kernel runs a command only once the person approved it on this machine (its digest in
the state folder's :data:`APPROVED_FILE`, written on the host by ``fluffy config tests
approve`` or the question ``fluffy`` asks as it starts the kernel; ADR-081).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fluffy.errors import ConfigError
from fluffy.kernel.project.files import read_text
from fluffy.kernel.project.records import read_strings, write_strings
from fluffy.kernel.yamltext import YamlSyntax, load_yaml_node

JUNIT = "{junit}"
#: The evidence's words for what a project's own command ran ("... ran no tests").
OWN_COMMAND = "the project's test command"
#: A ``tests: command:`` that writes JUnit XML, for a JavaScript runner fluffy has no
#: route of its own for (the packages are laid out in /node_modules, ADR-072).
JS_COMMANDS = {
    "mocha": "[node, /node_modules/mocha/bin/mocha.js, --reporter, xunit, "
    '--reporter-option, "output={junit}"]',
}


class TestCommand(BaseModel):
    """``tests:`` in ``.fluffy/config.yaml``."""

    __test__ = False  # not a pytest test class
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    command: list[str] | None = Field(default=None, min_length=1, max_length=200)
    env: dict[str, str] = Field(default_factory=dict, max_length=100)
    junit: str = JUNIT

    @field_validator("command")
    @classmethod
    def _plain(cls, value: list[str] | None) -> list[str] | None:
        for part in value or []:
            if "\x00" in part or len(part) > 4096:
                raise ValueError("each argument is a plain string of at most 4096 characters")
        return value

    @field_validator("junit")
    @classmethod
    def _report(cls, value: str) -> str:
        if value != JUNIT and not value.startswith("/tmp/"):  # noqa: S108 - in the sandbox
            raise ValueError(
                "the project is read-only in the test sandbox: write the report to {junit} "
                "(or a path under /tmp/)"
            )
        return value

    def settings(self) -> dict[str, Any]:
        """The test tool's settings for this command (only ``env`` when it names none)."""
        if self.command is None:
            return {"env": dict(self.env)}
        return {"command": list(self.command), "env": dict(self.env), "junit": self.junit}

    def digest(self) -> str:
        """What the person approves: the command, its variables and its report's path."""
        canonical = json.dumps(self.settings(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def shown(self) -> str:
        """The command as a person reads it (a shell's quoting), with its variables; any
        character a terminal would act on (escape sequences, carriage returns, direction
        marks) written as its code, so the file cannot redraw the question it is in."""
        words = shlex.join(self.command or [])
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        text = f"{env} {words}".strip()
        return "".join(c if c.isprintable() else f"\\x{{{ord(c):x}}}" for c in text)


#: In the kernel's state folder (written on the host): the digests of the project test
#: commands the person approved on this machine (ADR-081).
APPROVED_FILE = "approved-test-commands.json"


def approved(state: Path) -> set[str]:
    """The approved commands' digests (none when the record is missing or unreadable)."""
    return set(read_strings(state, APPROVED_FILE, "digests"))


def approve(state: Path, command: TestCommand) -> None:
    """Record the person's yes to ``command`` (atomically, next to earlier ones)."""
    write_strings(state, APPROVED_FILE, "digests", approved(state) | {command.digest()})


def not_approved(command: TestCommand) -> ConfigError:
    """A project test command the person has not said yes to on this machine."""
    return ConfigError(
        f"test.run: the project's test command ({command.shown()}) is not approved on this "
        "machine; the tests were not run",
        why="that command (`tests: command:` in .fluffy/config.yaml) writes the JUnit report "
        "fluffy reads as the TDD evidence, so it decides what counts as green, and a "
        "repository you cloned can ship that file",
        fix="Read the command, then run `fluffy config tests approve` in the project (it "
        "shows the command and asks), or answer y when `fluffy` asks as it starts. Or remove "
        "`tests: command:` from .fluffy/config.yaml to let fluffy run pytest.",
    )


def load_test_command(project: Path) -> TestCommand | None:
    """The project's ``tests:`` setting, or None (pytest); ConfigError if malformed."""
    text = read_text(project, ".fluffy/config.yaml", 256 * 1024)
    if text is None:
        return None
    try:
        data, _ = load_yaml_node(text, ".fluffy/config.yaml", "configuration files")
    except YamlSyntax as exc:
        raise ConfigError(
            str(exc),
            fix="Fix the YAML syntax of .fluffy/config.yaml.",
            why="the project's settings file is not valid YAML",
        ) from None
    raw = data.get("tests") if isinstance(data, dict) else None
    if raw is None:
        return None
    try:
        return TestCommand.model_validate(raw)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise ConfigError(
            f".fluffy/config.yaml: tests.{where}: {problem['msg']}",
            fix="See docs/architecture.md (test runners) for the `tests:` setting.",
            why="the `tests:` setting does not match its schema",
        ) from None


def command_example(runner: str | None) -> str:
    """A ``tests: command:`` value (YAML) for ``runner`` that writes JUnit XML to
    ``{junit}``: the runner's own when fluffy knows one, else mocha's as the pattern."""
    if runner is not None and runner in JS_COMMANDS:
        return JS_COMMANDS[runner]
    return f"{JS_COMMANDS['mocha']}  # mocha's; {runner or 'a runner'}'s JUnit reporter likewise"
