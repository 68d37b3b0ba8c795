"""The built-in tool plugins, each against temp folders standing in for the mounts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluffy.plugins.sdk import Roots, check_plugin, execute_job, scrubbed
from fluffy.plugins.search_tool.globs import Glob
from fluffy.plugins.test_tool.junit import junit_counts
from tests.unit.builtin_support import call, error, ok, plugin_of, snapshot
from tests.unit.trees import write_tree

PLUGINS = ("fs_tool", "search_tool", "git_tool", "test_tool", "container_tool")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture()
def roots(tmp_path: Path) -> Roots:
    roots = Roots(tmp_path / "workspace", tmp_path / "staged", tmp_path / "output")
    for folder in (roots.workspace, roots.staged / "tree", roots.output):
        folder.mkdir(parents=True)
    return roots


def materialise(roots: Roots, target: Path) -> Path:
    """The view as a plain folder (workspace + staged tree - deleted), for applying."""
    subprocess.run(["cp", "-a", f"{roots.workspace}/.", str(target)], check=True)
    subprocess.run(["cp", "-a", f"{roots.staged / 'tree'}/.", str(target)], check=True)
    deleted = roots.staged / "deleted.txt"
    for rel in deleted.read_text().split() if deleted.exists() else []:
        (target / rel).unlink()
    return target


def apply_changes(result: dict[str, Any], call_dir: Path, view: Path) -> None:
    """Apply a result's changes the way the kernel would (patches with `git apply`)."""
    for change in result["changes"]:
        if change["op"] == "patch":
            subprocess.run(["git", "apply", str(call_dir / change["file"])], cwd=view, check=True)
        elif change["op"] == "full":
            (view / change["path"]).write_bytes((call_dir / change["file"]).read_bytes())
        else:
            assert change["op"] == "delete"
            (view / change["path"]).unlink()


# -- manifests ------------------------------------------------------------------------
@pytest.mark.parametrize("module", PLUGINS)
def test_manifest_matches_the_plugin(module: str) -> None:
    folder = ROOT / "plugins" / module
    manifest = yaml.safe_load((folder / "manifest.yaml").read_text())
    plugin = plugin_of(module)
    assert manifest["name"] == plugin.name
    assert int(manifest["version"].split(".")[0]) == plugin.version
    assert manifest["runtime"] == "python" and (folder / manifest["entry"]).is_file()
    assert manifest["entry"] == "plugin.py" and manifest["sandbox_template"] == "code-executor"
    assert "core_plugin" in manifest["tags"] and manifest["min_api_version"] == 1
    assert manifest["tools"] == [tool.to_dict() for tool in plugin.tools()]
    assert set(manifest) >= {"description", "author", "required_capabilities"}


# -- fs -------------------------------------------------------------------------------
def test_fs_write_and_edit_produce_patches_that_apply_to_the_view(
    roots: Roots, tmp_path: Path
) -> None:
    write_tree(roots.workspace, {"a.py": "x = 1\ny = 2\n", "b.py": "old\n", "gone.py": "bye\n"})
    write_tree(roots.staged / "tree", {"b.py": "staged\nstaged\n"})  # b.py as the session sees it
    (roots.staged / "deleted.txt").write_text("gone.py\n")
    before = snapshot(roots.workspace)

    written = ok(call(roots, "fs.write", {"path": "a.py", "content": "x = 10\ny = 2"}, "w"))
    assert written["path"] == "a.py" and not written["created"] and written["changed"]
    created = ok(call(roots, "fs.write", {"path": "./pkg//new.py", "content": "n\n"}, "n"))
    assert created["created"] and created["changes"][0]["path"] == "pkg/new.py"
    edit = {"path": "b.py", "old_string": "staged", "new_string": "edited", "replace_all": True}
    edited = ok(call(roots, "fs.edit", edit, "e"))
    assert edited["replacements"] == 2
    same = ok(call(roots, "fs.write", {"path": "a.py", "content": "x = 1\ny = 2\n"}, "s"))
    assert same == {"path": "a.py", "created": False, "changed": False, "changes": []}

    view = materialise(roots, tmp_path / "view")
    for call_id, result in (("w", written), ("n", created), ("e", edited)):
        apply_changes(result, roots.output / call_id, view)
    assert (view / "a.py").read_text() == "x = 10\ny = 2"
    assert (view / "pkg" / "new.py").read_text() == "n\n"
    assert (view / "b.py").read_text() == "edited\nedited\n"
    assert snapshot(roots.workspace) == before  # the project itself is never written


def test_fs_edit_needs_a_unique_exact_match(roots: Roots) -> None:
    write_tree(roots.workspace, {"m.py": "a = 1\na = 1\nb = 2\n"})
    args = {"path": "m.py", "old_string": "a = 1", "new_string": "a = 3"}
    assert "occurs 2 times" in error(call(roots, "fs.edit", args), "tool.input_invalid")
    missing = {**args, "old_string": "zzz"}
    assert "not found" in error(call(roots, "fs.edit", missing), "tool.input_invalid")
    same = {**args, "new_string": "a = 1"}
    assert "nothing would change" in error(call(roots, "fs.edit", same), "tool.input_invalid")
    nofile = {**args, "path": "nope.py"}
    assert "does not exist" in error(call(roots, "fs.edit", nofile), "tool.input_invalid")
    unique = ok(call(roots, "fs.edit", {**args, "old_string": "b = 2", "new_string": "b = 4"}))
    assert unique["replacements"] == 1 and len(unique["changes"]) == 1


def test_fs_delete_and_the_paths_it_refuses(roots: Roots) -> None:
    write_tree(roots.workspace, {"d.txt": "x\n", "dir/f.txt": "y\n"})
    assert ok(call(roots, "fs.delete", {"path": "d.txt"}))["changes"] == [
        {"path": "d.txt", "op": "delete"}
    ]
    assert "cannot be deleted" in error(
        call(roots, "fs.delete", {"path": "none.txt"}), "tool.input_invalid"
    )
    for bad in ("/etc/passwd", "../outside", ".git/config", "a/../../b"):
        reply = call(roots, "fs.write", {"path": bad, "content": "x"})
        assert "Fix:" in error(reply, "tool.input_invalid")
    assert "folder" in error(
        call(roots, "fs.write", {"path": "dir", "content": "x"}), "tool.input_invalid"
    )
    assert not (roots.output / "c1" / "0.diff").exists()


# -- search ---------------------------------------------------------------------------
@pytest.fixture()
def project(roots: Roots, tmp_path: Path) -> Roots:
    write_tree(
        roots.workspace,
        {
            "src/app.py": "def main():\n    return 'Needle'\n",
            "src/util.py": "needle = 1\r\nother = 2\n",
            "src/old.py": "needle in a deleted file\n",
            "docs/notes.md": "a needle here\nand NEEDLE there\n",
            "bin.dat": b"needle\x00binary",
            "big.txt": "needle\n" * 200_000,
            ".git/config": "needle in git\n",
        },
    )
    write_tree(roots.staged / "tree", {"src/app.py": "def main():\n    return 'changed'\n"})
    write_tree(roots.staged / "tree", {"src/new.py": "# needle staged\n"})
    (roots.staged / "deleted.txt").write_text("src/old.py\n")
    outside = tmp_path / "outside"
    write_tree(outside, {"secret.py": "needle outside\n"})
    (roots.workspace / "escape").symlink_to(outside)
    (roots.workspace / "escape.py").symlink_to(outside / "secret.py")
    return roots


def test_grep_searches_the_view_only(project: Roots) -> None:
    found = ok(call(project, "search.grep", {"pattern": "needle"}))
    assert found["truncated"] is False and "changes" not in found
    assert found["matches"] == [
        {"path": "docs/notes.md", "line": 1, "text": "a needle here"},
        {"path": "src/new.py", "line": 1, "text": "# needle staged"},
        {"path": "src/util.py", "line": 1, "text": "needle = 1"},
    ]
    folded = ok(call(project, "search.grep", {"pattern": "needle", "case_insensitive": True}))
    assert {"path": "docs/notes.md", "line": 2, "text": "and NEEDLE there"} in folded["matches"]
    assert not any(m["path"] == "src/app.py" for m in folded["matches"])  # staged: 'changed'


def test_grep_filters_by_path_and_glob_and_truncates(project: Roots) -> None:
    by_glob = ok(call(project, "search.grep", {"pattern": "needle", "glob": "*.py"}))
    assert [m["path"] for m in by_glob["matches"]] == ["src/new.py", "src/util.py"]
    deep = ok(call(project, "search.grep", {"pattern": "needle", "glob": "docs/**"}))
    assert [m["path"] for m in deep["matches"]] == ["docs/notes.md"]
    in_file = ok(call(project, "search.grep", {"pattern": "=", "path": "src/util.py"}))
    assert [m["line"] for m in in_file["matches"]] == [1, 2]
    capped = ok(
        call(project, "search.grep", {"pattern": "e", "max_results": 2, "case_insensitive": True})
    )
    assert len(capped["matches"]) == 2 and capped["truncated"] is True
    bad = call(project, "search.grep", {"pattern": "(unclosed"})
    assert "regular expression" in error(bad, "tool.input_invalid")
    nowhere = call(project, "search.grep", {"pattern": "x", "path": "missing"})
    assert "neither a file nor a folder" in error(nowhere, "tool.input_invalid")
    escape = call(project, "search.grep", {"pattern": "x", "path": "escape"})
    error(escape, "tool.input_invalid")


def test_glob_lists_view_files(project: Roots) -> None:
    found = ok(call(project, "search.glob", {"pattern": "**/*.py"}))
    assert found == {"paths": ["src/app.py", "src/new.py", "src/util.py"], "truncated": False}
    capped = ok(call(project, "search.glob", {"pattern": "*", "max_results": 1}))
    assert capped == {"paths": ["big.txt"], "truncated": True}


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("**/*.py", "a.py", True),
        ("**/*.py", "a/b/c.py", True),
        ("*.py", "a/b/c.py", True),
        ("src/*.py", "src/a/b.py", False),
        ("src/**/*.py", "src/a.py", True),
        ("src/**/*.py", "src/a/b/c.py", True),
        ("src/**/*.py", "lib/src/a.py", False),
        ("test_?.py", "t/test_a.py", True),
        ("test_?.py", "test_ab.py", False),
        ("[ab].txt", "c.txt", False),
        ("[!ab].txt", "c.txt", True),
        ("[a-c]x", "bx", True),
        ("docs/**", "docs/a/b.md", True),
        ("./docs/*.md", "docs/a.md", True),
        ("a+b(c).txt", "a+b(c).txt", True),
        ("src", "src/a/b.py", True),  # a folder: what is inside it
        ("\\#notes.md", "#notes.md", True),
    ],
)
def test_globs(pattern: str, path: str, matches: bool) -> None:
    assert Glob(pattern).matches(path) is matches


@pytest.mark.parametrize("pattern", ["", "  ", "./", "!*.py", "#notes"])
def test_a_glob_that_would_match_nothing_is_refused(pattern: str) -> None:
    from fluffy.errors import ToolInputInvalid

    with pytest.raises(ToolInputInvalid) as refused:
        Glob(pattern)
    assert refused.value.why and refused.value.fix


# -- test -----------------------------------------------------------------------------
CALC = (
    "def add(a, b):\n    return a + b\n\n\n"
    "def sign(x):\n    if x < 0:\n        return -1\n    return 1\n"
)
TESTS = (
    "from calc import add, sign\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
    "def test_sign_fails():\n    assert sign(-5) == 1\n"
)


@pytest.fixture()
def tiny(roots: Roots, tmp_path: Path) -> Roots:
    """A view as the kernel lays it out (project + staged changes, one folder)."""
    write_tree(
        roots.workspace,
        {
            "calc.py": CALC,
            "tests/test_calc.py": TESTS,
            "tests/test_more.py": "def test_more():\n    assert True\n",
            ".venv/lib/test_hidden.py": "def test_hidden():\n    assert False\n",
            "conftest.py": "import sys, os\nsys.path.insert(0, os.path.dirname(__file__))\n",
            "pyproject.toml": '[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n',
        },
    )
    (roots.workspace / "inside_link.py").symlink_to("calc.py")
    return roots


def test_test_run_reports_counts_junit_and_coverage(tiny: Roots) -> None:
    """The view is run where it is: nothing is copied, nothing written into it (pytest's
    cache goes to /tmp), the project's own pytest settings apply."""
    before = snapshot(tiny.workspace)
    result = ok(call(tiny, "test.run", {}))
    assert result["exit_code"] == 1
    assert result["counts"] == {
        "found": 3,
        "run": 3,
        "passed": 2,
        "failed": 1,
        "errors": 0,
        "skipped": 0,
    }
    call_dir = tiny.output / "c1"
    assert result["junit"] == "junit.xml" and (call_dir / "junit.xml").is_file()
    # reported with failures too: failures the base has as well still make a green run
    assert result["coverage"] == "coverage.json"
    assert "1 failed, 2 passed" in result["output_tail"]
    green = ok(call(tiny, "test.run", {"paths": ["tests/test_more.py", "tests/test_calc.py"],
                                       "keyword": "not fails"}, "c2"))  # fmt: skip
    assert green["exit_code"] == 0 and green["coverage"] == "coverage.json"
    coverage = json.loads((tiny.output / "c2" / "coverage.json").read_text())
    calc = coverage["files"]["calc.py"]["summary"]
    assert 0 < calc["covered_lines"] < calc["num_statements"]  # sign() is half covered
    from fluffy.kernel.workflow.coverage import parse_coverage

    report = parse_coverage((tiny.output / "c2" / "coverage.json").read_bytes())
    assert report.files["calc.py"] == (calc["covered_lines"], calc["num_statements"])
    bare = _run_with(tiny, {"coverage": False}, "c3")  # test_writing: no coverage at all
    assert bare["coverage"] is None and not (tiny.output / "c3" / ".coverage").exists()
    assert not (call_dir / "view").exists()  # no copy of the project per call
    assert snapshot(tiny.workspace) == before


def test_test_run_uses_the_environment_the_kernel_names(roots: Roots, tmp_path: Path) -> None:
    """settings.python runs the tests (its bin first on PATH); without it the import roots
    go on PYTHONPATH, so a src layout imports without being installed."""
    write_tree(
        roots.workspace,
        {
            "src/pkg/__init__.py": "VALUE = 3\n",
            "tests/test_env.py": (
                "import os, sys\nfrom pkg import VALUE\n\ndef test_env():\n"
                "    assert VALUE == 3\n    print('PYEXE', sys.executable)\n"
                "    print('VENV', os.environ.get('VIRTUAL_ENV'))\n"
            ),
        },
    )
    plain = _run_with(roots, {"import_roots": ["src"]}, "e1")
    assert plain["exit_code"] == 0, plain["output_tail"]
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(os.path.realpath(os.sys.executable))
    chosen = _run_with(roots, {"python": str(venv / "bin" / "python"), "import_roots": ["src"]},
                       "e2")  # fmt: skip
    # the named interpreter ran (this bare one has no coverage: an environment would)
    assert chosen["exit_code"] != 0
    assert f"{venv / 'bin' / 'python'}: No module named coverage" in chosen["output_tail"]


def _run_with(roots: Roots, settings: dict[str, Any], call_id: str) -> dict[str, Any]:
    plugin = plugin_of("test_tool")
    job = {
        "call_id": call_id,
        "tool": "test.run",
        "args": {},
        "session_mode": "strict",
        "settings": settings,
    }
    reply = execute_job(check_plugin(plugin), plugin.name, job, roots, env=scrubbed(os.environ))
    return ok(reply)


def test_test_run_runs_a_projects_own_command(roots: Roots) -> None:
    """A test command from .fluffy/config.yaml: placeholders filled, its JUnit XML read."""
    runner = (
        "import sys\nopen(sys.argv[1], 'w').write('<testsuites><testsuite>"
        '<testcase classname="spec" name="adds" file="spec/add.js"/>'
        '<testcase classname="spec" name="subtracts" file="spec/add.js">'
        '<failure message="expected 2 to be 3"/></testcase>'
        "</testsuite></testsuites>')\nprint('ran', sys.argv[2:])\nsys.exit(1)\n"
    )
    write_tree(roots.workspace, {"run_specs.py": runner})
    settings = {"command": ["python3", "run_specs.py", "{junit}", "{paths}", "--ci"]}
    plugin = plugin_of("test_tool")
    job = {"call_id": "k1", "tool": "test.run", "args": {"paths": ["spec/add.js"]},
           "session_mode": "strict", "settings": settings}  # fmt: skip
    reply = execute_job(check_plugin(plugin), plugin.name, job, roots, env=scrubbed(os.environ))
    result = ok(reply)
    assert result["exit_code"] == 1 and result["junit"] == "junit.xml"
    assert result["counts"]["failed"] == 1 and result["counts"]["passed"] == 1
    assert "ran ['spec/add.js', '--ci']" in result["output_tail"]
    assert result["coverage"] is None


def test_a_projects_command_that_wrote_no_report_is_answered_for_the_kernel_to_judge(
    roots: Roots,
) -> None:
    """mocha writes no report when a test file does not load: the run and its output go
    to the kernel (which reads the load failure, or refuses the run), never an error
    that loses them."""
    failing = "import sys\nprint(\"Error: Cannot find module '../lib/x'\")\nsys.exit(1)\n"
    write_tree(roots.workspace, {"run_specs.py": failing})
    result = _run_with(roots, {"command": ["python3", "run_specs.py", "{junit}"]}, "n1")
    assert result["exit_code"] == 1 and result["junit"] is None
    assert "Cannot find module '../lib/x'" in result["output_tail"]


def test_the_projects_variables_reach_pytest_and_colour_codes_do_not_reach_the_model(
    roots: Roots,
) -> None:
    """``tests: env:`` alone: pytest runs with the project's variables; the output the
    model reads has no terminal codes."""
    test = (
        "import os\n\ndef test_tz():\n    print('\\x1b[31mcoloured\\x1b[0m')\n"
        "    print('\\x1b]8;;file:///a.py\\x07linked\\x1b]8;;\\x07', end=' ')\n"
        "    print('\\x1b[38;5;246m╭\\x1b(B\\x1b[m')\n"
        "    assert os.environ.get('TZ') == 'America/New_York'\n"
    )
    write_tree(roots.workspace, {"tests/test_tz.py": test})
    result = _run_with(roots, {"env": {"TZ": "America/New_York"}, "coverage": False}, "v1")
    assert result["exit_code"] == 0, result["output_tail"]
    bare = _run_with(roots, {"coverage": False}, "v2")
    assert bare["exit_code"] == 1 and "coloured" in bare["output_tail"]
    assert "\x1b" not in bare["output_tail"]
    assert "\nlinked ╭\n" in bare["output_tail"]  # a link and a colour, removed whole


def test_test_run_with_paths_keyword_and_no_tests(tiny: Roots) -> None:
    only = ok(call(tiny, "test.run", {"paths": ["tests/test_calc.py"], "keyword": "add"}))
    assert only["counts"]["found"] == 1
    assert only["exit_code"] == 0 and only["counts"]["passed"] == 1
    assert only["counts"]["found"] == 1
    none = ok(call(tiny, "test.run", {"keyword": "no_such_test"}, "c2"))
    assert none["exit_code"] == 5 and none["counts"]["run"] == 0
    bad = call(tiny, "test.run", {"paths": ["../x"]}, "c3")
    error(bad, "tool.input_invalid")


def test_test_run_times_out(roots: Roots) -> None:
    write_tree(
        roots.workspace, {"test_slow.py": "import time\n\ndef test_slow():\n    time.sleep(60)\n"}
    )
    message = error(call(roots, "test.run", {"timeout_s": 1}), "tool.timeout")
    assert "did not finish within 1 s" in message


def test_junit_counts_refuse_declarations_and_count_outcomes() -> None:
    report = (
        b'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite tests="4">'
        b'<testcase name="a"/><testcase name="b"><failure message="x"/></testcase>'
        b'<testcase name="c"><error message="y"/></testcase>'
        b'<testcase name="d"><skipped message="z"/></testcase></testsuite></testsuites>'
    )
    assert junit_counts(report) == {
        "found": 4,
        "run": 3,
        "passed": 1,
        "failed": 1,
        "errors": 1,
        "skipped": 1,
    }
    bomb = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><testsuite>&a;</testsuite>'
    from fluffy.errors import ToolFailed

    with pytest.raises(ToolFailed, match="was refused") as refused:
        junit_counts(bomb)
    assert "DOCTYPE" in refused.value.why
    with pytest.raises(ToolFailed, match="not well-formed XML"):
        junit_counts(b"<testsuite>")
    # the kernel's size limit, not a larger one of its own
    from fluffy.junit import MAX_REPORT_BYTES

    with pytest.raises(ToolFailed, match="too large"):
        junit_counts(b" " * (MAX_REPORT_BYTES + 1))
