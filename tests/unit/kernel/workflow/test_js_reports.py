"""A JavaScript project's own test command: mocha's xunit report read as a JavaScript
runner's, the verdict worded for the project's runner, and its crash output quoted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fluffy.junit import parse_junit
from fluffy.kernel.workflow.evidence import TestRun, TreeSnapshot

pytestmark = pytest.mark.unit

#: mocha 11's ``--reporter xunit --reporter-option output=...`` of a real run (the
#: folder it ran in replaced by /workspace, where the sandbox mounts the project):
#: test/test.js passes, test/new.test.js is a new file failing on an assertion and on a
#: missing function, build/time.test.js is tsc's CommonJS output calling a missing export.
MOCHA = (Path(__file__).parents[3] / "fixtures" / "mocha-xunit.xml").read_bytes()
#: mocha before its xunit reporter named each case's file (mocha < 10).
MOCHA_NO_FILES = re.sub(rb' file="[^"]*"', b"", MOCHA)
NEW = "test/new.test.js"


def _run(
    xml: bytes, changed: dict[str, str], runner: str = "the project's test command"
) -> TestRun:
    cases = tuple(parse_junit(xml, dialect="javascript"))
    return TestRun(("test.run", "{}"), 3, cases, TreeSnapshot(changed), TreeSnapshot({}), 1.0, 0.1,
                   runner=runner)  # fmt: skip


def test_mochas_xunit_cases_are_in_their_test_files_by_the_file_attribute() -> None:
    cases = {c.id: c for c in parse_junit(MOCHA, dialect="javascript")}
    assert {c.file for c in cases.values()} == {"test/test.js", NEW, "build/time.test.js"}
    assert not any(".py" in c.id or ".py" in c.file for c in cases.values())
    failing = [c for c in cases.values() if c.outcome == "failed"]
    assert len(cases) == 5 and len(failing) == 3
    deep = cases[f'{NEW}::mimeTypes .lookupAll(extension) > should return all types for ".json"']
    # no type or message attribute: the stack's AssertionError [ERR_ASSERTION] says it
    assert deep.assertion and deep.message == "Expected values to be strictly deep-equal:"
    assert deep.raised_in_test()
    missing = cases["build/time.test.js::time > converts minutes"]
    assert not missing.assertion and missing.message == "(0 , index_1.toSeconds) is not a function"
    assert missing.raised_in_test()


@pytest.mark.parametrize("xml", [MOCHA, MOCHA_NO_FILES], ids=["file attribute", "stack only"])
def test_a_new_mocha_test_file_failing_on_an_assertion_is_red(xml: bytes) -> None:
    red = _run(xml, {NEW: "new", "test/test.js": "same"})
    assert red.is_red(TreeSnapshot({"test/test.js": "same"}))
    assert red.red_reason(TreeSnapshot({"test/test.js": "same"})).startswith(
        "red: 1 new or changed test(s) fail on an assertion"
    )
    # the same run, with the failing file unchanged since test_writing began: not red
    same = TreeSnapshot({NEW: "new", "test/test.js": "same"})
    assert not red.is_red(same)


def test_without_file_attributes_a_case_keeps_one_id_whether_it_passes_or_fails() -> None:
    ids = [c.id for c in parse_junit(MOCHA_NO_FILES, dialect="javascript")]
    assert "mimeTypes .lookup(extension) > should return false for unknown" in ids
    assert "time > converts minutes" in ids  # the failing one's too: never its stack's file
    passed = [c for c in parse_junit(MOCHA_NO_FILES, dialect="javascript") if not c.message]
    assert passed and all(c.file == "" for c in passed)  # no file said: none guessed


def test_a_suite_level_file_names_its_cases_files() -> None:
    """mocha-junit-reporter names the file on the <testsuite>, not on each case."""
    xml = (
        b'<testsuites><testsuite name="Root Suite" file="/workspace/test/a.spec.js">'
        b'<testsuite name="slug" file="/workspace/test/a.spec.js"><testcase name="s" '
        b'classname="slug s"><failure message="expected 1 to equal 2" type="AssertionError">'
        b"AssertionError: expected 1 to equal 2</failure></testcase></testsuite>"
        b"</testsuite></testsuites>"
    )
    (case,) = parse_junit(xml, dialect="javascript")
    assert case.file == "test/a.spec.js" and case.id == "test/a.spec.js::slug s > s"
    assert case.assertion


def test_no_tests_names_the_runner_and_quotes_its_output() -> None:
    crashed = TestRun(
        ("test.run", "{}"), 1, (), TreeSnapshot({}), TreeSnapshot({}), 1.0, 0.1,
        runner="vitest", output="\n RUN  v3.2\n\nError: Cannot find module 'vite-plugin-x'\n",
    )  # fmt: skip
    said = crashed.red_reason(TreeSnapshot({}))
    assert said.startswith("not red: vitest ran no tests (exit code 1); its output ends: ")
    assert "Error: Cannot find module 'vite-plugin-x'" in said and "pytest" not in said
    again = TestRun.from_dict(crashed.to_dict())  # recorded, and read back for the guard
    assert again.red_reason(TreeSnapshot({})) == said
    unknown = TestRun(("test.run", "{}"), 5, (), TreeSnapshot({}), TreeSnapshot({}), 1.0, 0.1)
    assert unknown.red_reason(TreeSnapshot({})).startswith(
        "not red: the test run ran no tests (exit code 5);"
    )


def test_frames_are_looked_for_in_the_start_of_a_failure_only() -> None:
    """A test can make its message as long as it likes (``"a".repeat(1e6)``, no spaces):
    the stack's frames are looked for in its first JS_STACK_CHARS characters, so reading
    the report stays linear; a frame past them names nothing."""
    from fluffy.junit import JS_STACK_CHARS

    def case(text: str) -> str:
        xml = ('<testsuites><testcase classname="t" name="x"><failure message="m">'
               f"{text}</failure></testcase></testsuites>").encode()  # fmt: skip
        return parse_junit(xml, dialect="javascript")[0].file

    frame = "\n    at Context.&lt;anonymous&gt; (test/a.test.js:3:9)"
    assert case("Error: boom" + frame) == "test/a.test.js"
    assert case("Error: " + "a" * JS_STACK_CHARS + frame) == ""
    assert case("Error: " + "a" * 1_000_000 + frame) == ""  # linear: the old scan took hours
