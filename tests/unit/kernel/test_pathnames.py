"""File names that are not UTF-8 (a Latin-1 checkout, a hostile repository's): fluffy
keeps them, shows them quoted as git does, matches them by their readable part, and
never lets them crash a walk, a snapshot or an answer."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluffy.errors import FluffyError, ToolInputInvalid
from fluffy.images.envdownload import own_wheels
from fluffy.kernel.globs import GlobSet, Patterns, is_secret_file
from fluffy.kernel.policy.request_paths import PathEscape, normalize
from fluffy.kernel.project import nodelayout
from fluffy.kernel.project.deps import env_key, input_files
from fluffy.kernel.project.reqfiles import requirement_files
from fluffy.kernel.tools.reading.fastpath import UNNAMEABLE, FastPath
from fluffy.kernel.tools.testing.testview import TestViews
from fluffy.kernel.workflow.coverage import parse_coverage
from fluffy.kernel.workflow.evidence import snapshot_trees
from fluffy.pathnames import is_utf8, matchable, shown, unshown
from unit.trees import write_tree

LATIN1 = os.fsdecode(b"caf\xe9.txt")  # the str Python gives a Latin-1 name
FOLDER = os.fsdecode(b"d\xff")

names = st.binary(min_size=1, max_size=40).filter(lambda b: b"\0" not in b)


@given(names)
def test_every_name_is_shown_as_utf8_text_and_given_back(raw: bytes) -> None:
    name = os.fsdecode(raw)
    text = shown(name)
    assert is_utf8(text)
    assert unshown(text) == name
    assert is_utf8(matchable(name))


@given(names, names)
def test_distinct_names_are_shown_distinct(one: bytes, two: bytes) -> None:
    if one != two:
        assert shown(os.fsdecode(one)) != shown(os.fsdecode(two))


#: Bytes that quoting could confuse: quotes, backslashes, octal digits, broken UTF-8.
TRICKY = st.lists(
    st.sampled_from([b'"', b"\\", b"3", b"5", b"1", b"\xe9", b"\xc3", b"\xa9", b"/", b"\x01"]),
    min_size=1,
    max_size=8,
).map(b"".join)


@given(TRICKY, TRICKY)
def test_names_that_look_alike_are_shown_apart(one: bytes, two: bytes) -> None:
    a, b = os.fsdecode(one), os.fsdecode(two)
    assert (shown(a) == shown(b)) == (a == b)
    assert unshown(shown(a)) == a


def test_names_are_quoted_as_git_quotes_them() -> None:
    assert shown(LATIN1) == '"caf\\351.txt"'
    assert shown("plain/café.py") == "plain/café.py"  # UTF-8: as it is
    assert shown('"quoted".py') == '"\\"quoted\\".py"'  # never taken for a quoted one
    assert unshown('"\\"quoted\\".py"') == '"quoted".py'
    assert shown("tests/x\x01.py") == '"tests/x\\001.py"'  # no XML report carries \x01
    assert (
        shown("x\uffff.py") == '"x\\357\\277\\277.py"'
        and unshown(shown("x\uffff.py")) == "x\uffff.py"
    )
    assert unshown('"\\777"') == '"\\777"'[1:-1]  # no such byte: left as it is
    assert matchable("lone\ud800") == "lone\ufffd"  # what a JSON escape decodes to


def test_globs_match_a_name_by_its_readable_part() -> None:
    assert is_secret_file(os.fsdecode(b"prod\xe9.env"))
    assert GlobSet(["src/**", "!src/gen/**"]).match(os.fsdecode(b"src/caf\xe9.py"))
    assert not GlobSet(["src/**", "!src/gen/**"]).match(os.fsdecode(b"src/gen/\xe9.py"))
    assert Patterns(["tests/**"]).match(f"tests/{FOLDER}/test_x.py")
    assert not Patterns(["tests/**"]).match(LATIN1)


def test_a_model_cannot_name_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / LATIN1).write_text("x")
    with pytest.raises(PathEscape, match="not a path"):
        normalize(LATIN1, tmp_path)
    with pytest.raises(PathEscape, match="not a path"):
        normalize("lone\ud800.py", tmp_path)  # what a JSON "\ud800" escape decodes to
    (tmp_path / "link.txt").symlink_to(LATIN1)
    with pytest.raises(PathEscape, match="not UTF-8"):
        normalize("link.txt", tmp_path)
    with pytest.raises(ToolInputInvalid, match="not inside the project"):
        FastPath(tmp_path).run("fs.read", {"path": LATIN1}, None)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    root = write_tree(
        tmp_path / "p",
        {"src/mod.py": "def f():\n    return 1\n", "tests/test_mod.py": "import mod\n"},
    )
    (root / LATIN1).write_bytes(b"the person's file\n")
    (root / '"quoted".txt').write_text("a UTF-8 name the tools can open\n")
    (root / "tests" / FOLDER).mkdir()
    (root / "tests" / FOLDER / "test_odd.py").write_text("def test_odd():\n    pass\n")
    return root


def test_the_snapshot_keeps_such_files_and_stores_as_json(project: Path) -> None:
    tests, sources = snapshot_trees(project)
    assert '"caf\\351.txt"' in sources.files
    assert '"tests/d\\377/test_odd.py"' in tests.files
    msgspec.json.encode({"tests": dict(tests.files), "sources": dict(sources.files)})
    (project / LATIN1).write_bytes(b"changed by the person\n")
    _, after = snapshot_trees(project)
    assert after.changed_since(sources) == {'"caf\\351.txt"'}  # not lost from the evidence


def test_the_test_view_copies_them_and_hashes_them_as_the_evidence(project: Path) -> None:
    synced = TestViews(project.parent / "state", project, os.geteuid()).sync("s", {}, None)
    assert (synced.folder / LATIN1).read_bytes() == b"the person's file\n"
    assert (synced.folder / "tests" / FOLDER / "test_odd.py").is_file()
    tests, sources = snapshot_trees(project)
    assert (synced.tests.digest, synced.sources.digest) == (tests.digest, sources.digest)
    msgspec.json.encode(dict(synced.sources.files))


def test_the_model_sees_them_listed_quoted_and_nowhere_else(project: Path) -> None:
    fast = FastPath(project)
    listed = fast.run("fs.list", {"path": "."}, None)
    odd = [e for e in listed["entries"] if e["name"] == '"caf\\351.txt"']
    assert odd == [{"name": '"caf\\351.txt"', "type": "file", "size": 18, "note": UNNAMEABLE}]
    assert '"quoted".txt' in [e["name"] for e in listed["entries"]]  # as the tools name it
    msgspec.json.encode(listed)
    found = fast.run("search.grep", {"pattern": "person|odd"}, None)
    assert found["matches"] == []  # neither file is searched (no tool could open it)
    globbed = fast.run("search.glob", {"pattern": "**/*.py"}, None)  # (the view: no .txt)
    assert globbed["paths"] == ["src/mod.py", "tests/test_mod.py"]


def test_the_environment_key_takes_such_names(tmp_path: Path) -> None:
    write_tree(tmp_path, {".fluffy/wheels/ok-1.0-py3-none-any.whl": "w"})
    (tmp_path / ".fluffy" / "wheels" / os.fsdecode(b"x\xe9-1.0-py3-none-any.whl")).write_text("w")
    assert input_files(tmp_path) == [".fluffy/wheels/ok-1.0-py3-none-any.whl"]
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "test.txt").write_text("pytest\n")
    (tmp_path / "requirements" / LATIN1).write_text("pytest\n")
    assert requirement_files(tmp_path) == ["requirements/test.txt"]  # no text names it
    assert env_key({f"requirements/{LATIN1}": "0" * 64}, "img", "3.11", 1)


def test_javascript_tests_beside_code_in_such_a_folder_are_not_named(tmp_path: Path) -> None:
    write_tree(tmp_path, {"src/ok/a.test.ts": "test()\n"})
    (tmp_path / "src" / FOLDER).mkdir()
    (tmp_path / "src" / FOLDER / "a.test.ts").write_text("test()\n")
    found = nodelayout.tests_beside_code(tmp_path, ["src"])
    assert found == "src/ok/a.test.ts"


def test_a_coverage_report_naming_such_a_file_is_refused() -> None:
    # coverage.py traces no such file: a report naming one was written by something else
    entry = '{"summary": {"covered_lines": 1, "num_statements": 1}}'
    doc = '{"totals": {"covered_lines": 1, "num_statements": 1}, "files": {"caf\\udce9.py": %s}}'
    with pytest.raises(FluffyError, match="not a UTF-8 name"):
        parse_coverage((doc % entry).encode())


def test_a_wheel_under_such_a_name_is_noted_as_text(tmp_path: Path) -> None:
    wheels = tmp_path / ".fluffy" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / os.fsdecode(b"x\xe9-1.0-py3-none-any.whl")).write_text("w")
    notes: list[str] = []
    assert own_wheels(tmp_path, tmp_path / "out", notes) == {}
    assert notes == [
        ".fluffy/wheels/x\ufffd-1.0-py3-none-any.whl: not a wheel's file name; not used"
    ]
