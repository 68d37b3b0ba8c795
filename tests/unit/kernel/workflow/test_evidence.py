"""Test-run evidence: real pytest runs in throwaway projects, judged red/green/stale.

Every inner project carries its own ``pytest.ini`` so the outer repository's config
(``filterwarnings = error``, ``testpaths``...) never reaches the runs under test.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.errors import EvidenceError
from fluffy.junit import MAX_REPORT_BYTES, TestCase, parse_junit
from fluffy.kernel.workflow.evidence import (
    WHAT_IS_RED,
    TestRun,
    TreeSnapshot,
    run_pytest,
    snapshot_trees,
)
from unit.trees import write_tree

CALC = "def add(a, b):\n    return a - b\n"
TEST_ADD = "from calc import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"
PYTEST_INI = "[pytest]\npythonpath = .\n"


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    """A throwaway project: a minimal pytest.ini plus ``files``."""
    root = tmp_path / "proj"
    write_tree(root, {"pytest.ini": PYTEST_INI, **files})
    return root


def baseline(root: Path) -> TreeSnapshot:
    """The test tree as it was when test_writing began."""
    return snapshot_trees(root)[0]


# -- red ---------------------------------------------------------------------------------


def test_a_new_test_failing_on_an_assertion_is_red(tmp_path: Path) -> None:
    root = project(tmp_path, {"calc.py": CALC})
    base = baseline(root)
    write_tree(
        root,
        {
            "tests/test_calc.py": TEST_ADD,
        },
    )
    run = run_pytest(root)
    assert run.exit_code == 1
    assert run.cases == (
        TestCase(
            id="tests/test_calc.py::test_add",
            file="tests/test_calc.py",
            outcome="failed",
            assertion=True,
            message="assert -1 == 3",
            origin="tests/test_calc.py",  # raised in the test's own file
        ),
    )
    assert run.is_red(base)
    assert run.red_reason(base).startswith("red: 1 new or changed test(s)")
    assert "tests/test_calc.py::test_add" in run.red_reason(base)
    assert not run.is_green()


def test_a_changed_test_in_a_class_and_a_parametrized_one_are_red(tmp_path: Path) -> None:
    root = project(tmp_path, {"tests/test_k.py": "def test_old():\n    pass\n"})
    base = baseline(root)
    write_tree(
        root,
        {
            "tests/test_k.py": (
                "import pytest\n\nclass TestK:\n"
                "    def test_m(self):\n        assert [1] == [2]\n\n"
                "@pytest.mark.parametrize('x', ['a::b.c', 2])\ndef test_p(x):\n    assert x == 1\n"
            )
        },
    )
    run = run_pytest(root)
    ids = {c.id: c for c in run.cases}
    assert set(ids) == {
        "tests/test_k.py::TestK::test_m",
        "tests/test_k.py::test_p[a::b.c]",
        "tests/test_k.py::test_p[2]",
    }
    assert all(c.assertion and c.file == "tests/test_k.py" for c in run.cases)
    assert run.is_red(base)


def test_a_collection_import_error_is_not_red(tmp_path: Path) -> None:
    root = project(tmp_path, {"calc.py": CALC})
    base = baseline(root)
    write_tree(
        root, {"tests/test_calc.py": "import no_such_module_xyz\n\ndef test_x():\n    assert 0\n"}
    )
    run = run_pytest(root)
    assert run.exit_code == 2
    (case,) = run.cases
    assert (case.id, case.file, case.outcome, case.assertion) == (
        "tests/test_calc.py",
        "tests/test_calc.py",
        "error",
        False,
    )
    assert "No module named 'no_such_module_xyz'" in case.message
    assert not run.is_red(base)
    assert run.red_reason(base) == (
        "not red: tests/test_calc.py failed to import (ModuleNotFoundError: No module named "
        f"'no_such_module_xyz'); {WHAT_IS_RED}"
    )


def test_a_syntax_error_is_not_red(tmp_path: Path) -> None:
    root = project(tmp_path, {})
    base = baseline(root)
    write_tree(root, {"tests/test_s.py": "def test_x(:\n    assert 0\n"})
    run = run_pytest(root)
    assert not run.is_red(base)
    assert "failed to import (SyntaxError: invalid syntax)" in run.red_reason(base)


@pytest.mark.parametrize(
    "fixture_body",
    ['raise RuntimeError("fixture boom")', 'assert 0, "an assert in a fixture is still setup"'],
)
def test_a_fixture_error_is_not_red(tmp_path: Path, fixture_body: str) -> None:
    root = project(tmp_path, {})
    base = baseline(root)
    write_tree(
        root,
        {
            "tests/test_f.py": (
                "import pytest\n\n@pytest.fixture\ndef broken():\n    "
                f"{fixture_body}\n\ndef test_f(broken):\n    assert 1 == 2\n"
            )
        },
    )
    run = run_pytest(root)
    (case,) = run.cases
    assert (case.outcome, case.assertion) == ("error", False)
    assert case.message.startswith("failed on setup with")
    assert not run.is_red(base)
    assert "tests/test_f.py::test_f errored in fixture setup" in run.red_reason(base)


def test_a_teardown_error_after_an_assert_failure_is_not_red(tmp_path: Path) -> None:
    """pytest writes two <testcase> elements for one test; the error wins."""
    root = project(tmp_path, {})
    base = baseline(root)
    write_tree(
        root,
        {
            "tests/test_t.py": (
                "import pytest\n\n@pytest.fixture\ndef td():\n    yield\n"
                "    raise RuntimeError('teardown boom')\n\ndef test_t(td):\n    assert 0\n"
            )
        },
    )
    run = run_pytest(root)
    (case,) = run.cases
    assert case.outcome == "error"
    assert not run.is_red(base)
    assert "fixture teardown (RuntimeError)" in run.red_reason(base)


@pytest.mark.parametrize(
    ("body", "exc"),
    [
        ("1 / 0", "ZeroDivisionError"),
        ("import no_such_module_abc", "ModuleNotFoundError"),
        ("raise ValueError('assert me')", "ValueError"),
        ("pytest.fail('assert nothing')", "Failed"),
    ],
)
def test_a_test_body_failing_by_another_exception_is_not_red(
    tmp_path: Path, body: str, exc: str
) -> None:
    root = project(tmp_path, {})
    base = baseline(root)
    write_tree(root, {"tests/test_z.py": f"import pytest\n\ndef test_z():\n    {body}\n"})
    run = run_pytest(root)
    (case,) = run.cases
    assert (case.outcome, case.assertion) == ("failed", False)
    assert case.message.startswith(exc)
    assert not run.is_red(base)
    assert run.red_reason(base).startswith(f"not red: tests/test_z.py::test_z failed with {exc} (")
    assert run.red_reason(base).endswith(WHAT_IS_RED)


def test_an_assert_failure_in_an_unchanged_file_is_not_red(tmp_path: Path) -> None:
    root = project(tmp_path, {"tests/test_old.py": "def test_old():\n    assert 1 == 2\n"})
    base = baseline(root)
    run = run_pytest(root)
    assert run.cases[0].assertion
    assert not run.is_red(base)
    assert "its file is unchanged since test_writing began" in run.red_reason(base)
    assert run.is_red(TreeSnapshot({}))  # against an empty baseline the file is new


def test_raising_assertion_error_by_hand_counts_as_an_assertion(tmp_path: Path) -> None:
    root = project(tmp_path, {})
    write_tree(root, {"tests/test_r.py": "def test_r():\n    raise AssertionError('custom')\n"})
    run = run_pytest(root)
    assert run.cases[0].assertion
    assert run.cases[0].message == "AssertionError: custom"


# -- green -------------------------------------------------------------------------------


def test_all_passing_is_green_and_skips_and_xfails_are_counted(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        {
            "calc.py": "def add(a, b):\n    return a + b\n",
            "tests/test_calc.py": (
                "import pytest\nfrom calc import add\n\n"
                "def test_add():\n    assert add(1, 2) == 3\n\n"
                "def test_skip():\n    pytest.skip('later')\n\n"
                "@pytest.mark.xfail\ndef test_xfail():\n    assert 0\n"
            ),
        },
    )
    run = run_pytest(root)
    assert run.exit_code == 0
    assert run.counts == {"found": 3, "passed": 1, "failed": 0, "error": 0, "skipped": 2}
    assert run.is_green()
    assert not run.is_red(TreeSnapshot({}))
    assert run.red_reason(TreeSnapshot({})).startswith(
        "not red: all 3 test(s) passed or were skipped;"
    )


def test_no_tests_is_not_green(tmp_path: Path) -> None:
    root = project(tmp_path, {"calc.py": CALC})
    run = run_pytest(root)
    assert run.exit_code == 5
    assert run.cases == ()
    assert run.counts["found"] == 0
    assert not run.is_green()
    assert run.red_reason(TreeSnapshot({})).startswith(
        "not red: pytest ran no tests (exit code 5);"
    )


def test_a_failing_run_is_not_green(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        {"tests/test_a.py": "def test_ok():\n    pass\n\ndef test_bad():\n    assert 0\n"},
    )
    run = run_pytest(root)
    assert run.counts["passed"] == 1
    assert not run.is_green()


# -- staleness ---------------------------------------------------------------------------


def test_evidence_goes_stale_when_a_hashed_file_changes(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        {
            "src/calc.py": "def add(a, b):\n    return a + b\n",
            "tests/test_calc.py": "def test_ok():\n    pass\n",
        },
    )
    run = run_pytest(root)
    assert not run.is_stale(root)  # __pycache__ written by the run is ignored
    (root / "src" / "calc.py").write_text("def add(a, b):\n    return 0\n")
    assert run.is_stale(root)
    (root / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    assert not run.is_stale(root)  # content, not mtime
    (root / "tests" / "test_calc.py").write_text("def test_ok():\n    assert 1\n")
    assert run.is_stale(root)
    (root / "tests" / "test_calc.py").write_text("def test_ok():\n    pass\n")
    (root / "notes.txt").write_text("a new file")
    assert run.is_stale(root)
    (root / "notes.txt").unlink()
    assert not run.is_stale(root)
    (root / "tests" / "test_calc.py").unlink()
    assert run.is_stale(root)


# -- snapshots ---------------------------------------------------------------------------


def test_snapshot_splits_tests_from_sources_and_skips_ignored_paths(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    write_tree(
        root,
        {
            "src/calc.py": "x",
            "src/calc_test.py": "x",
            "src/test_util.py": "x",
            "src/conftest.py": "x",
            "tests/data/input.json": "{}",
            "README.md": "x",
            ".git/config": "x",
            ".fluffy/state.db": "x",
            "src/__pycache__/calc.cpython-311.pyc": "x",
            "stray.pyc": "x",
            ".venv/lib/site.py": "x",
            "sub/venv/lib/site.py": "x",
            "web/node_modules/left-pad/index.js": "x",
            ".pytest_cache/v/cache": "x",
            "fluffy.egg-info/PKG-INFO": "x",
        },
    )
    tests, sources = snapshot_trees(root)
    assert set(tests.files) == {
        "src/calc_test.py",
        "src/test_util.py",
        "src/conftest.py",
        "tests/data/input.json",
    }
    assert set(sources.files) == {"src/calc.py", "README.md"}
    assert sources.files["README.md"] == hashlib.sha256(b"x").hexdigest()
    custom_tests, custom_sources = snapshot_trees(root, ["spec/**"])
    assert custom_tests.files == {}
    assert "tests/data/input.json" in custom_sources.files


def test_symlinks_are_recorded_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write_tree(outside, {"secret.py": "x", "deep/more.py": "y"})
    root = tmp_path / "proj"
    write_tree(root, {"main.py": "x"})
    (root / "linked_dir").symlink_to(outside, target_is_directory=True)
    (root / "linked_file.py").symlink_to(outside / "secret.py")
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    (root / "tests").mkdir()
    (root / "tests" / "test_link.py").symlink_to("../main.py")
    tests, sources = snapshot_trees(root)
    assert set(sources.files) == {"main.py", "linked_dir", "linked_file.py", "dangling"}
    assert sources.files["linked_dir"] == (
        hashlib.sha256(b"symlink:" + os.fsencode(str(outside))).hexdigest()
    )
    assert tests.files == {"tests/test_link.py": hashlib.sha256(b"symlink:../main.py").hexdigest()}
    # Editing the target outside the project does not change the snapshot ...
    (outside / "secret.py").write_text("changed")
    assert snapshot_trees(root)[1] == sources
    # ... retargeting the link does.
    (root / "linked_file.py").unlink()
    (root / "linked_file.py").symlink_to(outside / "deep" / "more.py")
    assert snapshot_trees(root)[1].changed_since(sources) == {"linked_file.py"}


def test_large_files_are_hashed_by_streaming(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    blob = os.urandom(1024) * (9 * 1024 + 3)  # > 8 MiB
    (root / "big.bin").write_bytes(blob)
    _, sources = snapshot_trees(root)
    assert sources.files["big.bin"] == hashlib.sha256(blob).hexdigest()


def test_tree_digest_and_changes() -> None:
    a = TreeSnapshot({"x.py": "1" * 64, "y.py": "2" * 64})
    assert a.digest == TreeSnapshot({"y.py": "2" * 64, "x.py": "1" * 64}).digest
    assert a.digest != TreeSnapshot({"x.py": "1" * 64}).digest
    # The encoding is unambiguous: moving characters between path and hash changes it.
    assert TreeSnapshot({"ab": "c"}).digest != TreeSnapshot({"a": "bc"}).digest
    b = TreeSnapshot({"x.py": "1" * 64, "y.py": "3" * 64, "z.py": "4" * 64})
    assert b.changed_since(a) == {"y.py", "z.py"}
    assert a.changed_since(b) == {"y.py", "z.py"}
    assert TreeSnapshot({"w.py": "0"}).changed_since(a) == {"w.py", "x.py", "y.py"}
    assert a.changed_since(a) == set()


# -- records -----------------------------------------------------------------------------


def test_a_run_round_trips_through_json(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        {
            "calc.py": CALC,
            "tests/test_calc.py": TEST_ADD + "\ndef test_ok():\n    pass\n",
        },
    )
    run = run_pytest(root, extra_args=["-k", "test_add or test_ok"])
    assert run.command[-2:] == ("-k", "test_add or test_ok")
    assert "--junitxml=" + str(root) not in " ".join(run.command)  # report lives outside
    stored = json.dumps(run.to_dict())
    again = TestRun.from_dict(json.loads(stored))
    assert again == run
    assert again.to_dict() == run.to_dict()
    assert again.tests.digest == run.tests.digest
    assert again.duration_s >= 0
    assert again.started_at > 0


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d.pop("cases"),
        lambda d: d.update(version=2),
        lambda d: d.update(exit_code="one"),
        lambda d: d.update(tests=[1, 2]),
        lambda d: d["cases"][0].update(outcome="exploded"),
        lambda d: d["cases"][0].update(id=7),
        lambda d: d["cases"].append("not a case"),
    ],
)
def test_a_damaged_record_is_an_evidence_error(damage: object) -> None:
    run = TestRun(
        command=("pytest",),
        exit_code=1,
        cases=(TestCase("tests/test_a.py::test_a", "tests/test_a.py", "failed", True, "assert 0"),),
        tests=TreeSnapshot({"tests/test_a.py": "0" * 64}),
        sources=TreeSnapshot({}),
        started_at=1.0,
        duration_s=0.5,
    )
    data = run.to_dict()
    assert TestRun.from_dict(data) == run
    damage(data)  # type: ignore[operator]
    with pytest.raises(EvidenceError):
        TestRun.from_dict(data)


def test_a_failure_of_the_base_tree_too_does_not_make_a_run_red() -> None:
    """Green relative to the base (issue 33): only failures not seen on the base block."""
    old = TestCase("tests/test_old.py::test_x", "tests/test_old.py", "failed", True, "no db")
    new = TestCase("tests/test_new.py::test_y", "tests/test_new.py", "failed", True, "assert 0")
    ok = TestCase("tests/test_a.py::test_a", "tests/test_a.py", "passed", False, "")
    run = TestRun(("pytest",), 1, (old, ok), TreeSnapshot({}), TreeSnapshot({}), 1.0, 0.5)
    assert not run.is_green()
    known = TestRun(("pytest",), 1, (old, ok), TreeSnapshot({}), TreeSnapshot({}), 1.0, 0.5,
                    preexisting=(old.id,))  # fmt: skip
    assert known.is_green() and TestRun.from_dict(known.to_dict()) == known
    more = TestRun(("pytest",), 1, (old, new, ok), TreeSnapshot({}), TreeSnapshot({}), 1.0, 0.5,
                   preexisting=(old.id,))  # fmt: skip
    assert not more.is_green()  # a new failure always blocks
    crashed = TestRun(("pytest",), 2, (old, ok), TreeSnapshot({}), TreeSnapshot({}), 1.0, 0.5,
                      preexisting=(old.id,))  # fmt: skip
    assert not crashed.is_green()  # interrupted: not a verdict


# -- the runner --------------------------------------------------------------------------


def test_a_timeout_is_an_evidence_error(tmp_path: Path) -> None:
    root = project(
        tmp_path, {"tests/test_slow.py": "import time\n\ndef test_slow():\n    time.sleep(60)\n"}
    )
    with pytest.raises(EvidenceError, match="timed out after 2s"):
        run_pytest(root, timeout_s=2)


def test_a_usage_error_without_report_is_an_evidence_error(tmp_path: Path) -> None:
    root = project(tmp_path, {"tests/test_a.py": "def test_a():\n    pass\n"})
    with pytest.raises(EvidenceError, match="wrote no report") as info:
        run_pytest(root, extra_args=["--no-such-option"])
    assert "--no-such-option" in info.value.why


def test_inherited_pytest_addopts_do_not_shape_the_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path, {"tests/test_a.py": "def test_a():\n    pass\n"})
    monkeypatch.setenv("PYTEST_ADDOPTS", "--deselect tests/test_a.py::test_a")
    assert run_pytest(root).is_green()


# -- the junit parser --------------------------------------------------------------------

# What pytest 9 writes with the default junit_family (xunit2: no file= attribute).
XUNIT2 = b"""<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" errors="2" failures="3" skipped="2" tests="9">
<testcase classname="tests.test_a" name="test_pass" time="0.000"/>
<testcase classname="tests.test_a" name="test_assert" time="0.001">
 <failure message="assert 1 == 2">E   assert 1 == 2\n\ntests/test_a.py:3: AssertionError</failure>
</testcase>
<testcase classname="tests.test_a" name="test_zero" time="0.000">
 <failure message="ZeroDivisionError: division by zero">E   ZeroDivisionError</failure>
</testcase>
<testcase classname="tests.test_a" name="test_fix" time="0.000">
 <error message="failed on setup with &quot;RuntimeError: fixture boom&quot;">E   boom</error>
</testcase>
<testcase classname="tests.test_a" name="test_skip"><skipped type="pytest.skip" message="nah"/>
</testcase>
<testcase classname="tests.test_a" name="test_xf"><skipped type="pytest.xfail" message=""/>
</testcase>
<testcase classname="tests.sub.test_b.TestK" name="test_m[a::b.c]">
 <failure message="assert [1] == [2]&#10;  At index 0 diff">E   assert [1] == [2]</failure>
</testcase>
<testcase classname="test_root" name="test_ok"/>
<testcase classname="" name="tests.test_coll" time="0.000">
 <error message="collection failure">tests/test_coll.py:1: in &lt;module&gt;
    import nope
E   ModuleNotFoundError: No module named 'nope'</error>
</testcase>
</testsuite></testsuites>"""


def test_parse_junit_reads_pytest_xunit2_reports() -> None:
    cases = {c.id: c for c in parse_junit(XUNIT2)}
    assert list(cases) == [
        "tests/test_a.py::test_pass",
        "tests/test_a.py::test_assert",
        "tests/test_a.py::test_zero",
        "tests/test_a.py::test_fix",
        "tests/test_a.py::test_skip",
        "tests/test_a.py::test_xf",
        "tests/sub/test_b.py::TestK::test_m[a::b.c]",
        "test_root.py::test_ok",
        "tests/test_coll.py",
    ]
    outcomes = {k: (c.outcome, c.assertion) for k, c in cases.items()}
    assert outcomes["tests/test_a.py::test_pass"] == ("passed", False)
    assert outcomes["tests/test_a.py::test_assert"] == ("failed", True)
    assert outcomes["tests/test_a.py::test_zero"] == ("failed", False)
    assert outcomes["tests/test_a.py::test_fix"] == ("error", False)
    assert outcomes["tests/test_a.py::test_xf"] == ("skipped", False)
    assert outcomes["tests/sub/test_b.py::TestK::test_m[a::b.c]"] == ("failed", True)
    assert cases["tests/sub/test_b.py::TestK::test_m[a::b.c]"].message == "assert [1] == [2]"
    assert cases["tests/sub/test_b.py::TestK::test_m[a::b.c]"].file == "tests/sub/test_b.py"
    assert cases["tests/test_coll.py"].message == (
        "collection failure: ModuleNotFoundError: No module named 'nope'"
    )


def test_parse_junit_uses_xunit1_file_attributes() -> None:
    xml = b"""<testsuites><testsuite>
    <testcase classname="" name="pkg" file="pkg"><error message="collection failure"/></testcase>
    <testcase classname="a.b.tests.test_x.Inner" name="test_y" file="a.b/tests/test_x.py"/>
    <testcase classname="tests.test_sub.TestB" name="test_m" file="tests/base.py"/>
    </testsuite></testsuites>"""
    assert [(c.id, c.file) for c in parse_junit(xml)] == [
        ("pkg", "pkg"),
        ("a.b/tests/test_x.py::Inner::test_y", "a.b/tests/test_x.py"),
        # An inherited test's file= names the base class's module: fall back to classname.
        ("tests/test_sub.py::TestB::test_m", "tests/test_sub.py"),
    ]


def test_messages_are_one_line_and_truncated() -> None:
    long = "assert " + "x" * 500
    failure = f'<failure message="{long}&#10;more"/>'
    xml = f'<testsuite><testcase classname="t" name="n">{failure}</testcase></testsuite>'
    (case,) = parse_junit(xml.encode())
    assert case.message == long[:200]
    assert case.assertion


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>
<testsuites><testcase classname="a" name="&lol2;"/></testsuites>"""


@pytest.mark.parametrize(
    ("xml", "why"),
    [
        (BILLION_LAUGHS, "DOCTYPE"),
        (b'<!DOCTYPE x SYSTEM "file:///etc/passwd"><testsuites/>', "DOCTYPE"),
        (b"<testsuites><testcase name='a'>", "no element found"),
        (b"", "no element found"),
        (b"\xff\xfe garbage", ""),
        (b"<html><testcase name='a'/></html>", "root element is <html>"),
        (b"<testsuites><testcase classname='a'/></testsuites>", "no name"),
        (b"<testsuites><testcase name='a'><testcase name='b'/></testcase></testsuites>", "nested"),
    ],
)
def test_parse_junit_refuses_bad_reports(xml: bytes, why: str) -> None:
    with pytest.raises(EvidenceError) as info:
        parse_junit(xml, name="the report")
    assert why in info.value.why
    assert "the report" in info.value.what


def test_parse_junit_refuses_huge_reports() -> None:
    with pytest.raises(EvidenceError, match="too large"):
        parse_junit(b" " * (MAX_REPORT_BYTES + 1))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048))
def test_parse_junit_fuzz_arbitrary_bytes(data: bytes) -> None:
    try:
        result = parse_junit(data)
    except EvidenceError:
        return
    assert all(isinstance(c, TestCase) for c in result)


_TEXT = st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=30)


@st.composite
def junit_documents(draw: st.DrawFn) -> bytes:
    """Well-formed, junit-shaped documents with hostile names and messages."""
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        attrs = " ".join(
            f"{key}={quoteattr(draw(_TEXT))}"
            for key in draw(st.sets(st.sampled_from(["classname", "name", "file", "line"])))
            | {"name"}
        )
        children = "".join(
            f"<{tag} message={quoteattr(draw(_TEXT))}>{escape(draw(_TEXT))}</{tag}>"
            for tag in draw(
                st.lists(st.sampled_from(["failure", "error", "skipped", "system-out"]))
            )
        )
        parts.append(f"<testcase {attrs}>{children}</testcase>")
    root = draw(st.sampled_from(["testsuites", "testsuite"]))
    return f"<{root}>{''.join(parts)}</{root}>".encode()


@settings(max_examples=200, deadline=None)
@given(junit_documents())
def test_parse_junit_fuzz_junit_shaped(xml: bytes) -> None:
    for case in parse_junit(xml):
        assert case.outcome in ("passed", "failed", "error", "skipped")
        assert len(case.message) <= 200
        assert "\n" not in case.message
        assert not case.assertion or case.outcome == "failed"


def test_custom_test_globs_are_used_for_the_snapshot_and_for_staleness(tmp_path: Path) -> None:
    root = project(tmp_path, {"spec/test_a.py": "def test_a():\n    assert 0\n"})
    globs = ("spec/**",)
    run = run_pytest(root, test_globs=globs)
    assert set(run.tests.files) == {"spec/test_a.py"}
    assert "spec/test_a.py" not in run.sources.files
    assert not run.is_stale(root, globs)
    assert run.is_red(TreeSnapshot({}))
