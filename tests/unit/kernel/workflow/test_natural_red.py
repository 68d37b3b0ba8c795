"""Natural red: a new test failing because the code it tests is missing counts as red --
checked against the tree, never the message alone; the cheats stay refused."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from fluffy.kernel.tools.reading.fastpath import FastPath
from fluffy.kernel.tools.reading.treereader import SessionTree
from fluffy.kernel.workflow.evidence import TestRun, TreeSnapshot, run_pytest, snapshot_trees
from fluffy.kernel.workflow.missing import MissingCode, named_missing
from unit.trees import write_tree

CALC = """\
def add(a, b):
    return a + b


class Calc:
    factor = 1

    def __init__(self):
        self.memory = 0

    def add(self, a, b):
        return a + b


class Magic:
    def __getattr__(self, name):
        raise AttributeError(name)


class Mapping(dict):
    pass
"""


class NoStage:
    def __init__(self, overlay: Mapping[str, str | None] | None = None, files: dict[str, bytes]
                 | None = None) -> None:  # fmt: skip
        self._overlay = dict(overlay or {})
        self._files = files or {}

    def overlay(self) -> Mapping[str, str | None]:
        return self._overlay

    def read(self, rel: str) -> bytes | None:
        return self._files.get(rel)


def project(tmp_path: Path, extra: dict[str, str] | None = None) -> Path:
    root = write_tree(tmp_path / "p", {"calc.py": CALC, "pkg/__init__.py": "", **(extra or {})})
    (root / "tests").mkdir(exist_ok=True)
    return root


def judge(root: Path, third_party: frozenset[str] = frozenset(), stage: NoStage | None = None
          ) -> MissingCode:  # fmt: skip
    tree = SessionTree(FastPath(root, 1 << 20), stage or NoStage())
    return MissingCode(tree, (".", "tests"), third_party=lambda top: top in third_party)


def red_run(root: Path, test: str) -> tuple[TestRun, TreeSnapshot]:
    base, _ = snapshot_trees(root)
    (root / "tests" / "test_new.py").write_text(test)
    return run_pytest(root), base


NATURAL = {
    "missing function": (
        "from calc import subtract\n\ndef test_s():\n    assert subtract(3, 1) == 2\n"),
    "missing module attribute": "import calc\n\ndef test_m():\n    assert calc.mul(2, 3) == 6\n",
    "missing method": "from calc import Calc\n\ndef test_m():\n    assert Calc().sub(3, 1) == 2\n",
    "missing submodule": "def test_m():\n    from pkg import advanced\n    assert advanced\n",
    "missing dotted module": "import pkg.advanced\n\ndef test_m():\n    assert pkg\n",
    "missing new module": "from fib import fib\n\ndef test_f():\n    assert fib(10) == 55\n",
    "missing name": "from calc import *\n\ndef test_d():\n    assert divide(4, 2) == 2\n",
    "module, not a package": "def test_m():\n    import calc.advanced\n",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NATURAL))
def test_a_test_of_code_that_does_not_exist_yet_is_red(tmp_path: Path, case: str) -> None:
    root = project(tmp_path)
    run, base = red_run(root, NATURAL[case])
    proves = judge(root).proves
    assert not run.is_red(base)  # the message alone never counts
    assert run.is_red(base, proves), [c.message for c in run.cases]
    assert run.red_reason(base, proves).startswith("red: 1 new or changed test(s) fail on "
                                                   "missing code")  # fmt: skip


#: Project code that fails by itself: a package importing a generated file that is not
#: there (its environment is missing), a function calling a helper nobody wrote.
BROKEN = {"gen/__init__.py": "from ._version import v\n",
          "runner.py": "def run():\n    return helper()\n"}  # fmt: skip
CHEATS = {
    "the project's own broken import": "from gen import extra\n\ndef test_x():\n    assert 1\n",
    "a missing name inside project code": (
        "from runner import run\n\ndef test_x():\n    assert run() == 1\n"),
    "symbol exists (raised by hand)": (
        "def test_x():\n    raise ImportError(\"cannot import name 'add' from 'calc' (x)\")\n"),
    "a third-party module": "import requests_not_here\n\ndef test_x():\n    assert 1\n",
    "a declared dependency's symbol": "from wcwidth import nope\n\ndef test_x():\n    assert 1\n",
    "the standard library": "import json\n\ndef test_x():\n    assert json.nope\n",
    "a stdlib submodule": "import os.nope\n\ndef test_x():\n    assert 1\n",
    "a builtin type": "def test_x():\n    assert 'a'.nope\n",
    "a class with __getattr__": "from calc import Magic\n\ndef test_x():\n    Magic().nope\n",
    "a class with a foreign base": (
        "from calc import Mapping\n\ndef test_x():\n    Mapping().nope\n"),
    "an attribute set in __init__": (
        "from calc import Calc\n\ndef test_x():\n    del Calc().memory\n    Calc.memory\n"),
    "a name the project defines": "def test_x():\n    assert add(1, 2) == 3\n",
    "a syntax error": "def test_x(:\n    pass\n",
    "an arbitrary exception": "def test_x():\n    raise RuntimeError('boom')\n",
    "a fixture's import error": (
        "import pytest\n\n@pytest.fixture\ndef f():\n    from calc import nope\n\n"
        "def test_x(f):\n    assert 1\n"),
    "a circular import": (
        "def test_x():\n    raise ImportError(\"cannot import name 'x' from partially "
        "initialized module 'calc' (most likely due to a circular import)\")\n"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CHEATS))
def test_what_does_not_prove_missing_code_is_not_red(tmp_path: Path, case: str) -> None:
    root = project(tmp_path, BROKEN)
    run, base = red_run(root, CHEATS[case])
    proves = judge(root, frozenset({"requests_not_here", "wcwidth"})).proves
    assert not run.is_red(base, proves), [(c.outcome, c.message) for c in run.cases]
    assert run.red_reason(base, proves).startswith("not red: ")


def test_dynamic_modules_are_not_provably_missing_anything(tmp_path: Path) -> None:
    root = project(tmp_path, {"dyn.py": "def __getattr__(name):\n    return 1\n",
                              "star.py": "from calc import *\n"})  # fmt: skip
    check = judge(root)
    assert not check.proves("ImportError: cannot import name 'x' from 'dyn' (/w/dyn.py)")
    assert not check.proves("ImportError: cannot import name 'x' from 'star' (/w/star.py)")
    assert check.proves("ImportError: cannot import name 'x' from 'calc' (/w/calc.py)")


def test_the_tree_is_the_view_with_staged_changes(tmp_path: Path) -> None:
    root = project(tmp_path)
    staged = b"def add(a, b):\n    return a + b\n\n\ndef subtract(a, b):\n    return a - b\n"
    stage = NoStage({"calc.py": "sha"}, {"calc.py": staged})
    message = "ImportError: cannot import name 'subtract' from 'calc' (/w/calc.py)"
    assert judge(root).proves(message)
    assert not judge(root, stage=stage).proves(message)  # staged: it exists in the view
    gone = NoStage({"calc.py": None})
    assert not judge(root, stage=gone).proves(message)  # staged deletion: not the project's


def test_an_unchanged_test_file_is_never_red(tmp_path: Path) -> None:
    root = project(tmp_path, {"tests/test_old.py": NATURAL["missing function"]})
    base, _ = snapshot_trees(root)
    run = run_pytest(root)
    assert not run.is_red(base, judge(root).proves)
    assert run.is_red(TreeSnapshot({}), judge(root).proves)  # new against an empty baseline


@pytest.mark.parametrize(
    ("message", "kind", "target", "name"),
    [
        ("ImportError: cannot import name 'a' from 'b.c' (/x.py)", "name", "b.c", "a"),
        ("ModuleNotFoundError: No module named 'b.c'; 'b' is not a package", "module", "b.c", ""),
        ("AttributeError: module 'b' has no attribute 'a'", "attribute", "b", "a"),
        ("AttributeError: 'K' object has no attribute 'a'", "member", "K", "a"),
        ("AttributeError: type object 'K' has no attribute 'a'", "member", "K", "a"),
        ("NameError: name 'a' is not defined", "global", "a", ""),
    ],
)
def test_messages_are_parsed(message: str, kind: str, target: str, name: str) -> None:
    found = named_missing("collection failure: " + message)
    assert found is not None and (found.kind, found.target, found.name) == (kind, target, name)
    assert named_missing("ValueError: cannot import name 'a' from 'b'") is None


def test_a_run_stopped_by_the_sandboxs_pid_limit_says_so() -> None:
    from fluffy.kernel.tools.testing.testrun import limit_hit

    note = limit_hit("E   RuntimeError: can't start new thread", "code-executor")
    assert note is not None and "allows 100 processes and threads" in note
    assert limit_hit("E   assert 1 == 2", "code-executor") is None
