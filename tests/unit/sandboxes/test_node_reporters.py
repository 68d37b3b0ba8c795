"""fluffy's JUnit reporters for node's test runner and jest (sandboxes/node/) write what a
test printed without its terminal escape sequences: each removed whole before the control
characters XML cannot hold are dropped, so no ``[31m`` is left for the model to read.

They run under Node; the test is skipped where this machine has none (never in CI, where
FLUFFY_MUST_WORK is set: a missing Node fails it)."""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fluffy.junit import parse_junit

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(
        shutil.which("node") is None and not os.environ.get("FLUFFY_MUST_WORK"),
        reason="Node is not installed here",
    ),
]

REPORTERS = Path(__file__).parents[3] / "sandboxes" / "node"
#: vite's parse error as a coloured terminal shows it, with a hyperlink and a reset.
COLOURED = (
    "Transform failed with 1 error:\n\x1b[31m[PARSE_ERROR] Error:\x1b[0m Expected `;` but "
    "found `:`\n   \x1b[38;5;246m╭\x1b[0m\x1b[38;5;246m─\x1b[0m[ src/a.ts:3:7 ]\n"
    "\x1b]8;;file:///workspace/src/a.ts\x07src/a.ts\x1b]8;;\x07\x1b(B\x1b[m"
)
CLEAN = (
    "Transform failed with 1 error:\n[PARSE_ERROR] Error: Expected `;` but found `:`\n"
    "   ╭─[ src/a.ts:3:7 ]\nsrc/a.ts"
)
LEFTOVERS = ("[31m", "[0m", "[38;5;246m", "]8;;", "(B", "\x1b")


def _node(script: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        ["node", "--input-type=module", "-e", script],
        cwd=cwd, env=env, check=True, timeout=60, capture_output=True,
    )  # fmt: skip


def _readable(xml: bytes) -> str:
    """The report's text (fluffy reads it: well-formed), with no sequence left in it."""
    assert parse_junit(xml, dialect="javascript")
    text = html.unescape(xml.decode())
    for leftover in LEFTOVERS:
        assert leftover not in text, leftover
    return text


def test_node_test_runner_reporter(tmp_path: Path) -> None:
    file = str(tmp_path / "a.test.mjs")
    error = {"name": "Error", "message": COLOURED, "stack": COLOURED}
    events = [
        {"type": "test:start", "data": {"nesting": 0, "name": "parses"}},
        {"type": "test:fail", "data": {"nesting": 0, "name": "parses", "file": file,
                                       "details": {"error": error, "duration_ms": 1}}},
        {"type": "test:stderr", "data": {"file": str(tmp_path / "b.test.mjs"),
                                         "message": COLOURED}},
        {"type": "test:fail", "data": {"nesting": 0, "name": str(tmp_path / "b.test.mjs"),
                                       "file": str(tmp_path / "b.test.mjs"),
                                       "details": {"error": "failed", "duration_ms": 1}}},
    ]  # fmt: skip
    script = (
        f"import junit from {json.dumps(str(REPORTERS / 'node-test-junit.mjs'))};\n"
        "import { writeFileSync } from 'node:fs';\n"
        f"const events = {json.dumps(events)};\n"
        "async function* source() { for (const e of events) yield e; }\n"
        "let out = ''; for await (const part of junit(source())) out += part;\n"
        "writeFileSync('junit.xml', out);\n"
    )
    _node(script, tmp_path)
    text = _readable((tmp_path / "junit.xml").read_bytes())
    assert "[PARSE_ERROR] Error: Expected `;` but found `:`" in text
    assert CLEAN in text


def test_jest_reporter(tmp_path: Path) -> None:
    results = {"testResults": [{
        "testFilePath": str(tmp_path / "a.test.js"),
        "testResults": [{"ancestorTitles": ["a"], "title": "parses", "status": "failed",
                         "duration": 1, "failureMessages": [COLOURED], "failureDetails": []}],
    }]}  # fmt: skip
    script = (
        "import { createRequire } from 'node:module';\n"
        "const require = createRequire(import.meta.url);\n"
        f"const Reporter = require({json.dumps(str(REPORTERS / 'jest-junit.cjs'))});\n"
        f"new Reporter().onRunComplete([], {json.dumps(results)});\n"
    )
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "FLUFFY_JUNIT": str(tmp_path / "out.xml")}
    _node(script, tmp_path, env)
    text = _readable((tmp_path / "out.xml").read_bytes())
    assert CLEAN in text
