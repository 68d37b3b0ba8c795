"""A JavaScript/TypeScript project without .fluffy/: its layout read from its own files
(npm, pnpm, yarn; workspaces; src/ and lib/; test folders and *.test.* patterns; the test
script), the default policy fitted to it, and what the first run shows (issue 37)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pathspec import GitIgnoreSpec

from fluffy.cli.project import first_run_block
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.model import parse_policy
from fluffy.kernel.project.defaults import default_policy_text
from fluffy.kernel.project.layout import describe_node, detect_layout
from unit.trees import write_tree

pytestmark = pytest.mark.unit


VITEST = {
    "package.json": {"name": "ufo-like", "packageManager": "pnpm@9.1.0",
                     "scripts": {"test": "vitest run"}, "engines": {"node": ">=20.11"},
                     "devDependencies": {"vitest": "^2", "typescript": "^5"}},
    "pnpm-lock.yaml": "lockfileVersion: '9.0'\n",
    "src/index.ts": "export const x = 1\n",
    "test/index.test.ts": "",
    "vite.config.ts": "export default {}\n",
}  # fmt: skip


def test_a_pnpm_typescript_vitest_project(tmp_path: Path) -> None:
    layout = detect_layout(write_tree(tmp_path, VITEST))
    assert (layout.kind, layout.language, layout.name) == ("node", "javascript", "ufo-like")
    assert layout.source_roots == ("src",) and layout.test_roots == ("test",)
    assert layout.node is not None
    assert (layout.node.manager, layout.node.typescript, layout.node.runner) == (
        "pnpm", True, "vitest")  # fmt: skip
    # engines.node ">=20.11" allows fluffy's default, Node 24: what the build runs
    assert (layout.node.test_script, layout.node.node) == ("vitest run", "24")
    assert layout.describe() == (
        "JavaScript project (pnpm, TypeScript, vitest): src/; tests in test/, *.test.*, "
        "*.spec.*; test script: vitest run"
    )
    tests = GitIgnoreSpec.from_lines(layout.test_globs)
    for path in ("test/index.test.ts", "src/deep/a.spec.jsx", "src/__tests__/x.js", "a.test.mjs"):
        assert tests.match_file(path), path
    assert not tests.match_file("src/index.ts") and not tests.match_file("test_x.py")
    merge = GitIgnoreSpec.from_lines(layout.merge_globs)
    assert merge.match_file("src/util/a.ts") and not merge.match_file("vite.config.ts")


def test_a_yarn_monorepo_with_workspaces(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "package.json": {"private": True, "workspaces": ["packages/*", "../outside", "!x"],
                         "scripts": {"test": "jest"}, "devDependencies": {"jest": "29"}},
        "yarn.lock": "", ".nvmrc": "v22.19.0\n",
        "packages/core/package.json": {"name": "core"}, "packages/core/src/a.js": "",
        "packages/core/__tests__/a.js": "",
        "packages/cli/package.json": {"name": "cli"}, "packages/cli/index.js": "",
        "packages/notapackage/readme.md": "",
    })  # fmt: skip
    (tmp_path / "packages" / "linked").symlink_to(tmp_path / "packages" / "core")
    layout = detect_layout(tmp_path)
    assert layout.packages == ("packages/cli", "packages/core")  # no link, no non-package
    assert layout.source_roots == ("packages/cli", "packages/core/src")
    assert layout.test_roots == ("packages/core/__tests__",)
    assert layout.node is not None and (layout.node.manager, layout.node.runner) == ("yarn", "jest")
    assert layout.node.node == "22"
    assert any("workspaces from package.json" in note for note in layout.notes)


def test_pnpm_workspaces_and_an_npm_project_with_code_at_the_top(tmp_path: Path) -> None:
    pnpm = write_tree(tmp_path / "pnpm", {
        "package.json": {"name": "mono"}, "pnpm-workspace.yaml": "packages:\n  - 'apps/**'\n",
        "apps/web/package.json": {}, "apps/web/lib/x.js": "",
    })  # fmt: skip
    assert detect_layout(pnpm).source_roots == ("apps/web/lib",)
    tiny = {"name": "tiny", "scripts": {"test": "node --test"}}
    npm = write_tree(tmp_path / "npm", {"package.json": tiny, "package-lock.json": "{}",
                                  "index.js": "", "eslint.config.js": ""})  # fmt: skip
    layout = detect_layout(npm)
    assert layout.source_roots == (".",) and layout.node is not None
    assert (layout.node.manager, layout.node.runner) == ("npm", "node")
    source, merge = (GitIgnoreSpec.from_lines(g) for g in (layout.source_globs, layout.merge_globs))
    assert source.match_file("index.js") and merge.match_file("index.js")
    assert not merge.match_file("eslint.config.js") and not merge.match_file(".eslintrc.js")


def test_a_broken_package_json_is_noted_and_never_stops_detection(tmp_path: Path) -> None:
    write_tree(tmp_path, {"package.json": "{not json", "pnpm-workspace.yaml": "[: bad"})
    layout = detect_layout(tmp_path)
    assert layout.language == "python" and layout.kind == "empty"
    bad = {"workspaces": {"packages": ["/etc", "a/../.."]}, "engines": {"node": ["no"]},
           "scripts": {"test": 7}}  # fmt: skip
    hostile = write_tree(tmp_path / "h", {"package.json": bad})
    layout = detect_layout(hostile)
    assert layout.packages == () and layout.node is not None
    assert (layout.node.node, layout.node.test_script) == (None, None)


def test_a_python_project_with_a_package_json_stays_python(tmp_path: Path) -> None:
    write_tree(tmp_path, {"pyproject.toml": "[project]\nname='x'\n", "x/__init__.py": "",
                    "package.json": {"name": "docs-site"}})  # fmt: skip
    layout = detect_layout(tmp_path)
    assert layout.language == "python" and layout.packages == ("x",)
    assert any("package.json found too" in note for note in layout.notes)


def test_the_default_policy_is_tests_first_where_the_project_keeps_them(tmp_path: Path) -> None:
    write_tree(tmp_path, VITEST)
    text = default_policy_text(tmp_path)
    engine = PolicyEngine(parse_policy(text), root=tmp_path)
    ai = Caller("fs-tool", frozenset({"ai", "core_plugin"}))

    def decide(path: str, state: str, mode: str = "strict") -> str:
        request = Request("fs.write", ai, path=path, state=state, mode=mode, size=10,
                          sandbox="code-executor")  # fmt: skip
        return engine.evaluate(request).result

    assert decide("src/add.test.ts", "test_writing") == "allow"  # a test beside the code
    assert decide("test/add.spec.js", "test_writing") == "allow"
    assert decide("src/add.ts", "test_writing") == "deny"  # tests first
    assert decide("src/add.ts", "code_writing") == "allow"
    assert decide("README.md", "code_writing") == "deny"
    for sensitive in (
        "package.json",
        "pnpm-lock.yaml",
        ".pnpmfile.cjs",
        "vite.config.ts",
        "tsconfig.json",
        ".yarn/plugins/x.cjs",
        ".nvmrc",
        ".eslintrc.json",
    ):
        assert decide(sensitive, "exploring", "explore") == "require_review", sensitive
    assert "Layout fluffy found: JavaScript project (pnpm, TypeScript, vitest)" in text


def test_the_first_run_says_what_was_found_and_how_node_tests_run(
    tmp_path: Path,
) -> None:
    layout = detect_layout(write_tree(tmp_path, VITEST)).to_dict()
    block = first_run_block({"policy": {"default": True}, "layout": layout})
    assert "JavaScript project (pnpm, TypeScript, vitest)" in block[1]
    assert "*.test.*" in block[2] and "src/**" in block[2]
    assert "vitest with Node and the lock file's packages laid out offline" in block[3]
    assert layout["node"]["lock"] == "pnpm-lock.yaml"


def test_the_first_run_says_so_when_no_lock_file_brings_packages(tmp_path: Path) -> None:
    """fastify/deepmerge keeps no lock file (``package-lock=false``): nothing is installed,
    and the first run must not promise the lock file's packages."""
    tree = {k: v for k, v in VITEST.items() if k != "pnpm-lock.yaml"}
    layout = detect_layout(write_tree(tmp_path, tree)).to_dict()
    assert layout["node"]["lock"] is None
    line = first_run_block({"policy": {"default": True}, "layout": layout})[3]
    assert "lock file's packages" not in line
    assert "no lock file, so no packages are installed" in line
    assert "npm install --package-lock-only" in line


def test_tests_kept_beside_the_code_make_no_test_folder_of_their_own(tmp_path: Path) -> None:
    """vercel/ms keeps ``src/format.test.ts`` beside ``src/format.ts`` and has no test
    folder: fluffy says so and invents none (a test written to ``test/`` is one its runner
    never finds); the code folder itself never becomes a test folder (tests first)."""
    write_tree(tmp_path, {
        "package.json": {"name": "ms", "devDependencies": {"jest": "30.0.5", "ts-jest": "29"}},
        "tsconfig.json": "{}", "src/index.ts": "export {}\n", "src/format.test.ts": "x\n",
    })  # fmt: skip
    layout = detect_layout(tmp_path)
    assert layout.test_roots == ()
    assert "src/**" not in layout.test_globs and "**/*.test.ts" in layout.test_globs
    assert "tests beside the code (e.g. src/format.test.ts)" in layout.notes
    assert describe_node(layout).endswith("tests in *.test.*, *.spec.* beside the code")
    engine = PolicyEngine(parse_policy(default_policy_text(tmp_path)), root=tmp_path)
    ai = Caller("fs-tool", frozenset({"ai", "core_plugin"}))
    for path, allowed in [("src/new.test.ts", "allow"), ("src/new.ts", "deny")]:
        request = Request("fs.write", ai, path=path, state="test_writing", mode="strict",
                          size=10, sandbox="code-executor")  # fmt: skip
        assert engine.evaluate(request).result == allowed, path
    # a project without any test yet keeps the conventional folder for its first one
    (tmp_path / "src/format.test.ts").unlink()
    assert detect_layout(tmp_path).test_roots == ("test",)
