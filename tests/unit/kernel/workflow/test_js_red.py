"""JavaScript evidence: runners' JUnit read as cases, natural red checked against the tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fluffy.junit import parse_junit
from fluffy.kernel.project.nodeenv import DEFAULT_NODE, node_major, node_test_command
from fluffy.kernel.project.nodelayout import NodeFacts
from fluffy.kernel.workflow.jsmissing import JsMissingCode

pytestmark = pytest.mark.unit

#: vitest 4's own JUnit (trimmed from a real run on unjs/ufo).
VITEST = (Path(__file__).parents[3] / "fixtures" / "vitest-junit.xml").read_bytes()


@pytest.mark.parametrize(
    ("kind", "message", "assertion"),
    [
        ("AssertionError", "expected 1 to be 2", True),
        ("Error", "expect(received).toBe(expected)", True),
        ("", "AssertionError: 1 == 2", True),
        ("ReferenceError", "expect is not defined", False),
        ("TypeError", "expect(...).toBeInTheDocument is not a function", False),
        ("TypeError", "expected.map is not a function", False),
        ("AssertionError", "New snapshot was not written. The update flag must be set", False),
    ],
)
def test_a_javascript_failure_is_an_assertion_by_its_type(
    kind: str, message: str, assertion: bool
) -> None:
    xml = (
        f'<testsuites><testcase classname="t.test.js" name="a" file="t.test.js">'
        f'<failure type="{kind}" message="{message}">at t.test.js:1:1</failure>'
        "</testcase></testsuites>"
    ).encode()
    (case,) = parse_junit(xml, dialect="javascript")
    assert case.assertion is assertion


def test_vitest_cases_are_per_file_and_only_assertion_errors_are_assertions() -> None:
    cases = {c.id: c for c in parse_junit(VITEST, dialect="javascript")}
    assert list(cases) == [
        "test/new.test.ts", "test/new2.test.ts::q > asserts", "test/new2.test.ts::q > missing",
        "test/new2.test.ts::q > missing [2]",  # two tests of one name both count
    ]  # fmt: skip
    assert {c.file for c in cases.values()} == {"test/new.test.ts", "test/new2.test.ts"}
    assert cases["test/new2.test.ts::q > asserts"].assertion
    assert not cases["test/new2.test.ts::q > missing"].assertion  # a TypeError is not one
    assert cases["test/new.test.ts"].raised_in_test()
    assert not cases["test/new2.test.ts::q > missing [2]"].raised_in_test()  # in src/inner.ts
    # as another runner's report, every failure would have been an assertion
    assert all(c.assertion for c in parse_junit(VITEST, dialect="junit"))


class Tree:
    def __init__(self, files: dict[str, str]) -> None:
        self.files_ = files

    def read(self, rel: str) -> bytes | None:
        text = self.files_.get(rel)
        return None if text is None else text.encode()

    def is_dir(self, rel: str) -> bool:
        return any(k.startswith(rel + "/") for k in self.files_)

    def files(self, folder: str, suffixes: tuple[str, ...], limit: int) -> list[str]:
        prefix = "" if folder in ("", ".") else folder + "/"
        return [k for k in sorted(self.files_) if k.startswith(prefix) and k.endswith(suffixes)][
            :limit
        ]


TREE = {
    "src/index.ts": "export * from './utils';\n",
    "src/utils.ts": "export function withQuery() {}\n// slugify: later\n",
    "src/util.js": "export const a = 1;\n",
    "src/utils.test.ts": "import { brandNew } from './utils';\n",
    "test/a.test.ts": "import { brandNew } from '../src';\n",
}


@pytest.mark.parametrize(
    ("message", "red"),
    [
        ("(0 , __vite_ssr_import_1__.brandNew) is not a function", True),
        ("TypeError: (0 , _src.brandNew) is not a function", True),
        ("m.brandNew is not a function", False),  # a member of some object: not proven
        ("__vi_import_0__.brandNew is not a function", True),
        ("brandNew is not defined", True),
        ("ReferenceError: brandNew is not defined", True),
        ("The requested module '../src/a.mjs' does not provide an export named 'brandNew'", True),
        ('No matching export in "src/utils.ts" for import "brandNew"', True),
        ("'brandNew' is not exported by src/utils.ts", True),
        ("Brand is not a constructor", True),
        # the project has it (declared, or only said in a comment): not proven missing
        ("(0 , __vite_ssr_import_1__.withQuery) is not a function", False),
        ("slugify is not defined", False),
        # modules: a path of the project with no file at all
        ("Cannot find module '../src/nothing' imported from '/workspace/test/a.test.ts'", True),
        (
            "Cannot find module '/workspace/src/nothing.js' imported from /workspace/test/a.mjs",
            True,
        ),
        ("Cannot find module './nothing' from 'test/a.test.ts'", True),
        (
            "Failed to load url ../src/nope (resolved id: ../src/n) in /workspace/test/a.test.ts",
            True,
        ),
        ("Cannot find module '../src/utils.js' imported from '/workspace/test/a.test.ts'", False),
        ("Cannot find module '../src/util' imported from '/workspace/test/a.test.ts'", False),
        ("Cannot find module '../src' from 'test/a.test.ts'", False),  # src/index.ts
        ("Cannot find module 'left-pad' from 'test/a.test.ts'", False),  # a package
        ("Cannot find module '../../../etc/x' from 'test/a.test.ts'", False),  # outside
        ("Cannot find module './nothing'", False),  # from where?
        # other failures, and TypeScript's compile errors, are not red
        ("TS2305: Module '\"../src\"' has no exported member 'brandNew'.", False),
        ("Cannot read properties of undefined (reading 'x')", False),
        # a setup is missing (vitest's globals, jsdom, CommonJS in an ES module), or a typo
        # on a library's object: never the project's missing code
        ("ReferenceError: describe is not defined", False),
        ("vi is not defined", False),
        ("document is not defined", False),
        ("ReferenceError: __dirname is not defined in ES module scope", False),
        ("require is not defined in ES module scope, you can use import instead", False),
        ("fs.readFileSynk is not a function", False),
        # an importer not in the tree (jest's rootDir), build output a build would make
        ("Cannot find module './nothing' from 'a.test.ts'", False),
        ("Cannot find module '../dist/index.mjs' imported from '/workspace/test/a.test.ts'", False),
        ("expected 1 to be 2", False),
        # the words somewhere else in an assertion's message prove nothing
        ("TypeError: expected \"Cannot find module '/workspace/src/zz.js'\" to be 3", False),
        ("Error: boom (see does not provide an export named 'zzz')", False),
        (
            "Error [ERR_MODULE_NOT_FOUND]: Cannot find module '/workspace/src/zz.js' imported "
            "from /workspace/test/a.test.ts",
            True,
        ),
    ],
)
def test_natural_red_is_checked_against_the_tree(message: str, red: bool) -> None:
    assert JsMissingCode(Tree(TREE), ("src", ".")).proves(message) is red


def test_code_beside_the_roots_counts_too() -> None:
    tree = Tree({**TREE, "index.js": "export function rootOnly() {}\n"})
    assert JsMissingCode(tree, ("src", ".")).proves("rootOnly is not defined") is False


def test_a_word_in_a_file_too_large_to_read_is_not_ruled_out() -> None:
    tree = Tree({"src/big.js": "x" * (3 * 1024 * 1024)})
    assert JsMissingCode(tree, ("src",)).proves("brandNew is not defined") is False


def _project(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "major", "source"),
    [
        ({".nvmrc": "v20.11.1\n"}, 20, ".nvmrc"),
        ({".node-version": "22\n"}, 22, ".node-version"),
        ({".nvmrc": "lts/*\n"}, DEFAULT_NODE, "fluffy's default"),
        (
            {"package.json": json.dumps({"engines": {"node": ">=18"}})},
            DEFAULT_NODE,
            "package.json (engines.node)",
        ),
        (
            {"package.json": json.dumps({"engines": {"node": "^20.9.0"}})},
            20,
            "package.json (engines.node)",
        ),
        (
            {"package.json": json.dumps({"engines": {"node": "^18 || ^20"}})},
            20,
            "package.json (engines.node)",
        ),
        ({}, DEFAULT_NODE, "fluffy's default"),
        (
            {"package.json": json.dumps({"engines": {"node": ">=18 <21"}})},
            20,
            "package.json (engines.node)",
        ),
        # a range no Node of fluffy's meets (">=30", "<=16") stops the build instead:
        # tests/unit/kernel/project/test_node_version.py
    ],
)
def test_the_node_major_comes_from_the_projects_files(
    tmp_path: Path, files: dict[str, str], major: int, source: str
) -> None:
    assert node_major(_project(tmp_path, files)) == (major, source)


def test_each_runner_gets_a_command_that_writes_junit() -> None:
    vitest = node_test_command(NodeFacts(runner="vitest"))
    jest = node_test_command(NodeFacts(runner="jest"))
    plain = node_test_command(NodeFacts(runner=None))
    assert vitest and jest and plain
    assert "--outputFile.junit={junit}" in vitest["command"]
    assert jest["env"]["FLUFFY_JUNIT"] == "{junit}" and any(
        "jest-junit" in p for p in jest["command"]
    )
    assert (
        "--test" in plain["command"] and "--test-reporter-destination={junit}" in plain["command"]
    )
    assert node_test_command(NodeFacts(runner="mocha")) is None  # no JUnit route: config names one
    # coverage off whatever the project's config says (jest's collectCoverage, thresholds)
    assert "--coverage=false" in jest["command"]
    assert "--coverage.enabled=false" in vitest["command"]


def test_a_failed_import_is_raised_in_the_test_file_that_imports() -> None:
    """Node's ESM loader fails before any frame of the test file runs: the file named as
    the importer is where the failure is."""
    xml = (
        b'<testsuites><testcase classname="tests/a.test.js" name="tests/a.test.js" '
        b'file="tests/a.test.js"><error type="Error" message="Error [ERR_MODULE_NOT_FOUND]: '
        b"Cannot find module '/workspace/lib/x' imported from /workspace/tests/a.test.js\">"
        b"node:internal/modules/esm/resolve:275</error></testcase>"
        b'<testcase classname="tests/b.test.js" name="tests/b.test.js" file="tests/b.test.js">'
        b"<error type=\"Error\" message=\"Cannot find module 'y' from 'lib/other.js'\">"
        b"</error></testcase></testsuites>"
    )
    own, other = parse_junit(xml, dialect="javascript")
    assert own.outcome == "error" and own.raised_in_test()
    assert not other.raised_in_test()  # lib/other.js's import failed, not the test's


@pytest.mark.parametrize(
    ("message", "red"),
    [
        # TypeScript's CommonJS output (ts-jest, tsc): the import binding is <module>_<n>
        ("TypeError: (0 , index_1.brandNew) is not a function", True),
        ("(0, index_1.brandNew) is not a function", True),
        ("(0 , utils_2.brandNew) is not a function", True),
        ("(0 , foo_bar_1.brandNew) is not a function", True),
        ("TypeError: index_1.Brand is not a constructor", True),  # new index_1.Brand()
        ("(0 , import_src.brandNew) is not a function", True),  # esbuild's binding
        ("_src.Brand is not a constructor", True),  # babel's new _src.Brand()
        # the tree has it, or it is a member of some object: not proven
        ("(0 , index_1.withQuery) is not a function", False),
        ("fs.readFileSynk is not a function", False),
        ("index_1.brandNew is not a function", False),  # a bare member call: not proven
        ("data.brandNew is not a function", False),
        ("TS2305: (0 , index_1.brandNew) is not a function", False),
    ],
)
def test_typescripts_import_bindings_are_natural_red_when_the_tree_lacks_the_name(
    message: str, red: bool
) -> None:
    assert JsMissingCode(Tree(TREE), ("src", ".")).proves(message) is red


def test_a_ts_jest_run_is_red_on_a_missing_export() -> None:
    """ts-jest runs TypeScript compiled to CommonJS: a call of an export the module lacks
    fails as ``(0 , index_1.toSeconds) is not a function`` in the test's own file."""
    from fluffy.kernel.workflow.evidence import TestRun, TreeSnapshot

    xml = (
        b'<testsuites><testcase classname="src/time.test.ts" name="time &gt; converts" '
        b'file="src/time.test.ts" time="0.002"><failure type="TypeError" message="(0 , '
        b'index_1.toSeconds) is not a function">TypeError: (0 , index_1.toSeconds) is not a '
        b"function\n    at Object.&lt;anonymous&gt; (/workspace/src/time.test.ts:5:35)"
        b"</failure></testcase></testsuites>"
    )
    tree = Tree({"src/index.ts": "export function fromSeconds() {}\n"})
    run = TestRun(
        ("test.run", "{}"), 1, tuple(parse_junit(xml, dialect="javascript")),
        TreeSnapshot({"src/time.test.ts": "new"}), TreeSnapshot({}), 1.0, 0.1, runner="jest",
    )  # fmt: skip
    proves = JsMissingCode(tree, ("src", ".")).proves
    assert run.is_red(TreeSnapshot({}), proves)
    assert "fail on missing code" in run.red_reason(TreeSnapshot({}), proves)
    # the module has it: a TypeError that proves nothing
    has_it = JsMissingCode(Tree({"src/index.ts": "export const toSeconds = 1;\n"}), ("src",))
    assert not run.is_red(TreeSnapshot({}), has_it.proves)


def test_the_runners_fluffy_names_are_the_ones_it_has_a_command_for() -> None:
    """fluffy.junit.JS_RUNNERS (what the CLI and the evidence call a runner) and the
    kernel's commands agree: a runner is named exactly when it has a JUnit route."""
    from fluffy.junit import JS_RUNNERS

    for runner in ("vitest", "jest", "node", None, "mocha", "ava", "tap", "uvu"):
        routed = node_test_command(NodeFacts(runner=runner)) is not None
        assert routed == (runner in JS_RUNNERS), runner
