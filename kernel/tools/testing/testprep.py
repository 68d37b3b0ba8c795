"""Everything a ``test.run`` needs before its sandbox starts (the kernel's side).

1. the environment (:func:`fluffy.kernel.project.envstate.choose`): the image the
   project's dependency files ask for, an older one with a note, or none;
2. the session's test view brought in step (:mod:`fluffy.kernel.tools.testing.testview`),
   with the files the environment's install generated laid in;
3. the test tool's settings: the interpreter, the import roots, ``--no-cov`` when
   pytest-cov is installed, or the project's own test command (``.fluffy/config.yaml``).

A JavaScript project's tests run with the runner's JUnit route (vitest, jest, node's
own) or the project's own command; one with neither is refused with what to configure,
never run with pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import ConfigError
from fluffy.junit import JS_RUNNERS, Dialect
from fluffy.kernel.containers.runtime import sandbox_identity
from fluffy.kernel.project.envstate import ENV_ROOT, EnvChoice, choose, third_party_modules
from fluffy.kernel.project.layout import Layout
from fluffy.kernel.project.nodeenv import node_test_command
from fluffy.kernel.project.testcmd import (
    OWN_COMMAND,
    approved,
    command_example,
    load_test_command,
    not_approved,
)
from fluffy.kernel.tools.testing.canary import draw
from fluffy.kernel.tools.testing.testview import Synced, TestViews


class TestPlan(msgspec.Struct):
    __test__ = False  # not a pytest test class

    synced: Synced
    choice: EnvChoice | None
    settings: dict[str, Any] = msgspec.field(default_factory=dict)
    custom: bool = False
    #: whose JUnit the run writes (pytest's, a project command's, a JavaScript runner's)
    dialect: Dialect = "pytest"
    #: what runs the tests, in the words the evidence says it with ("vitest ran no tests")
    runner: str = "pytest"

    @property
    def canary(self) -> str | None:
        """The run's canary token (pytest runs only: :mod:`.canary`)."""
        token = self.settings.get("canary")
        return token if isinstance(token, str) else None

    @property
    def image(self) -> str | None:
        record = self.choice.record if self.choice is not None else None
        return record.image if record is not None else None


class TestPreparer:
    """Prepares test runs of one project (call :meth:`prepare` off the event loop)."""

    __test__ = False

    def __init__(
        self,
        project: Path,
        state_dir: Path,
        layout: Layout,
        views: TestViews,
        base_image: Callable[[], str | None],
    ) -> None:
        self.project = project
        self.state_dir = state_dir
        self.layout = layout
        self.views = views
        self.base_image = base_image

    def mirror_needed(self) -> bool:
        """Whether sandboxes cannot read the project folder themselves: a root-owned
        project closed to others (``mktemp -d`` as root, ``umask 077``), which only the
        kernel reads (it holds the file capabilities, bootstrap/l1.py).  Then every
        sandbox works on the kernel's copy of the view instead."""
        uid, gid = sandbox_identity()
        info = self.project.stat()
        shift = 6 if info.st_uid == uid else 3 if info.st_gid == gid else 0
        return (info.st_mode >> shift) & 0o5 != 0o5

    def mirror(
        self, session_id: str, overlay: Mapping[str, str | None], staged_tree: Path | None,
        test_globs: Sequence[str], *, git: bool,
    ) -> Path:  # fmt: skip
        """The session's view (with git's metadata when ``git``) for a sandbox."""
        return self.views.sync(
            session_id, overlay, staged_tree, test_globs=test_globs, git=git
        ).folder

    def environment(self) -> EnvChoice | None:
        base = self.base_image()
        if base is None:
            return None
        return choose(self.project, self.state_dir, base, self.layout.language)

    def third_party(self) -> Callable[[str], bool]:
        """Top-level modules of declared or installed distributions (natural red)."""
        choice = self.environment()
        names = third_party_modules(choice, self.project) if choice is not None else set()
        return lambda top: top in names

    def prepare(
        self,
        session_id: str,
        overlay: Mapping[str, str | None],
        staged_tree: Path | None,
        test_globs: Sequence[str],
        *,
        coverage: bool = True,
        tests: bool = True,
    ) -> TestPlan:
        """``coverage``: measure it (a run whose coverage the workflow may use: not a
        test_writing run, whose red or not needs none).  ``tests``: the plan runs the
        tests (False: a command in the test environment, which needs no test runner);
        a JavaScript project with no runner fluffy can read is then a ConfigError."""
        from packaging.utils import canonicalize_name

        command = load_test_command(self.project)
        javascript = self.layout.language == "javascript"
        own = command is not None and command.command is not None
        if (
            own
            and tests
            and command is not None
            and command.digest() not in approved(self.state_dir)
        ):
            raise not_approved(command)  # the repository's word on what counts as green
        node = node_test_command(self.layout.node) if javascript and not own else None
        if javascript and not own and node is None and tests:
            raise _no_junit_route(self.layout)
        choice = self.environment()
        record = choice.record if choice is not None else None
        generated = self.state_dir / "envs" / record.key / "generated" if record else None
        synced = self.views.sync(
            session_id,
            overlay,
            staged_tree,
            generated=generated,
            generated_files=record.generated if record else (),
            test_globs=test_globs,
            git=self.mirror_needed(),  # keep git's copy if sandboxes need it anyway
        )
        settings: dict[str, Any] = {
            "import_roots": list(self.layout.import_roots()),
            "coverage": coverage,
        }
        if record is not None and not record.node:
            settings["python"] = f"{ENV_ROOT}/bin/python"
            installed = {canonicalize_name(name) for name in record.packages}
            settings["no_cov"] = "pytest-cov" in installed
        if own and command is not None:
            settings.update(command.settings())
            dialect: Dialect = "javascript" if javascript else "junit"  # mocha's xunit too
            return TestPlan(synced, choice, settings, custom=True, dialect=dialect,
                            runner=OWN_COMMAND)  # fmt: skip
        own_env = command.env if command is not None else {}  # `tests: env:` alone
        if node is not None:
            settings.update(node, env={**node["env"], **own_env})
            return TestPlan(synced, choice, settings, custom=True, dialect="javascript",
                            runner=_runner(self.layout))  # fmt: skip
        settings["env"] = dict(own_env)
        settings["canary"] = draw()  # a test that must fail, in each file (a new token each run)
        return TestPlan(synced, choice, settings)


def _runner(layout: Layout) -> str:
    """The JavaScript runner fluffy runs a project's tests with, as people name it."""
    runner = layout.node.runner if layout.node is not None else None
    return JS_RUNNERS.get(runner, JS_RUNNERS[None])


def _no_junit_route(layout: Layout) -> ConfigError:
    """A JavaScript project whose runner fluffy cannot read, with no command configured."""
    runner = layout.node.runner if layout.node is not None else None
    said = f"the project's test runner, {runner}," if runner else "the project's test runner"
    return ConfigError(
        f"test.run: {said} has no JUnit route in fluffy, and .fluffy/config.yaml names no "
        "test command; the tests were not run",
        why="fluffy reads a JavaScript project's test results (the TDD evidence) from a "
        "JUnit XML report: it writes one itself for vitest, jest and node --test only, and "
        "never runs pytest in a JavaScript project",
        fix="Name the command that runs the tests and writes JUnit XML to {junit} in "
        f".fluffy/config.yaml (the person edits it; the AI cannot), e.g.\n"
        f"tests:\n  command: {command_example(runner)}",
    )
